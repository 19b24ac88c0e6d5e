// Package outbox is the Go producer side of relayd's SQL contract.
//
// A producer publishes a message by inserting a row into the outbox table in
// the same transaction as the business change that caused it, so the message
// exists if and only if that change committed; relayd then delivers it to the
// brokers. Any language can do this with a plain INSERT (see docs/producers.md,
// "The SQL contract"). This package does it for Go: it validates messages exactly
// as the relay will, before anything reaches the database (a failed statement
// would abort the caller's transaction), generates message ids client-side so
// they can be returned, and inserts a whole batch in one statement.
package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayd/relayd/schema"
)

// Message is one message to publish.
type Message struct {
	// ID is the message id, a UUID in canonical text form
	// (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx). Brokers deduplicate on it, so
	// set it when a retried producer may write the same message twice. Empty
	// means a random (version 4) UUID is generated.
	ID string
	// Topic is the AMQP routing key and the NATS subject suffix; see
	// [ValidateTopic].
	Topic string
	// Key orders messages: the relay publishes messages with the same key in
	// the order they were written. Empty is stored as NULL (no ordering).
	// At most [MaxKeyLen] bytes.
	Key string
	// Headers are published as AMQP and NATS headers; see [ValidateHeaders].
	// Nil or empty is stored as NULL.
	Headers map[string]string
	// Payload is the message body. It must not be nil; an empty slice is an
	// empty body.
	Payload []byte
}

// Config configures a [Writer].
type Config struct {
	// Table is the outbox table, "name" or "schema.name"; see
	// [schema.ParseTable]. Default: "outbox" (on the search_path).
	Table string
	// MaxPayload is the largest message accepted, in bytes: the payload,
	// the headers as NATS counts them ("key: value" lines) and 512 bytes
	// for the relay's own (Nats-Msg-Id, Nats-Expected-Stream). Default: 0,
	// no limit. Set it to the smallest message size limit of the brokers
	// relayd publishes to (NATS: max_payload, 1 MiB by default), so an
	// oversized message fails here rather than being parked by the relay.
	MaxPayload int
}

// PgxTx is what [Writer.Write] needs from pgx. pgx.Tx, *pgx.Conn,
// *pgxpool.Pool and *pgxpool.Conn all satisfy it.
type PgxTx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
}

// copyThreshold is the batch size from which Write uses COPY rather than an
// INSERT: COPY costs pgx an extra round trip to describe the table, but then
// streams the rows instead of building each column into one array.
const copyThreshold = 256

// columns are the columns a producer writes; the rest have defaults or
// belong to the relay.
var columns = []string{"message_id", "topic", "key", "headers", "payload"}

// Writer writes messages to one outbox table. It holds no connection and is
// safe for concurrent use.
type Writer struct {
	table      schema.Table
	maxPayload int
	insertSQL  string
}

// New returns a Writer for cfg, after applying defaults and validating it.
// An invalid table name returns an error wrapping [schema.ErrInvalidTable].
func New(cfg Config) (*Writer, error) {
	if cfg.Table == "" {
		cfg.Table = schema.DefaultTable
	}
	table, err := schema.ParseTable(cfg.Table)
	if err != nil {
		return nil, fmt.Errorf("outbox config: %w", err)
	}
	if cfg.MaxPayload < 0 {
		return nil, fmt.Errorf("outbox config: MaxPayload %d is negative", cfg.MaxPayload)
	}
	// One statement for any batch size, so it is prepared once. The arrays
	// are text (bar the payloads) so database/sql can pass them as array
	// literals; WITH ORDINALITY keeps the rows, and so their ids, in order.
	insertSQL := `INSERT INTO ` + table.Ident() + ` (` + strings.Join(columns, ", ") + `)
SELECT m::uuid, t, k, h::jsonb, p
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bytea[])
    WITH ORDINALITY AS u(m, t, k, h, p, n)
ORDER BY n`
	return &Writer{table: table, maxPayload: cfg.MaxPayload, insertSQL: insertSQL}, nil
}

// Write inserts msgs into the outbox table through tx and returns their
// message ids in the order of msgs (nil for no messages).
//
// tx should be the caller's transaction, so that the messages commit or roll
// back with the caller's business writes; the relay sees them only after
// commit. A *pgx.Conn or *pgxpool.Pool works too, but then each Write
// commits on its own.
//
// All messages are validated first: if one is invalid, Write returns a
// *[ValidationError] and sends nothing, so tx stays usable. Database errors,
// such as a unique violation on a given ID, are returned as pgx reports them
// and, like any failed statement, abort tx.
//
// Rows get ascending ids in the order of msgs: the relay publishes the
// messages of one Key in that order (messages without a key, in any order). Large batches are written with COPY; like the INSERT, it
// fires the table's trigger, which wakes the relay with one NOTIFY at commit.
func (w *Writer) Write(ctx context.Context, tx PgxTx, msgs ...Message) ([]string, error) {
	b, err := w.prepare(msgs)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	var n int64
	if len(msgs) < copyThreshold {
		tag, err := tx.Exec(ctx, w.insertSQL, b.ids, b.topics, b.keys, b.headers, b.payloads)
		if err != nil {
			return nil, fmt.Errorf("insert into %s: %w", w.table, err)
		}
		n = tag.RowsAffected()
	} else {
		n, err = tx.CopyFrom(ctx, w.identifier(), columns, pgx.CopyFromSlice(len(msgs), func(i int) ([]any, error) {
			return []any{b.uuids[i], b.topics[i], b.keys[i], b.headers[i], b.payloads[i]}, nil
		}))
		if err != nil {
			return nil, fmt.Errorf("copy into %s: %w", w.table, err)
		}
	}
	if n != int64(len(msgs)) {
		return nil, fmt.Errorf("write to %s: %d of %d rows inserted", w.table, n, len(msgs))
	}
	return b.ids, nil
}

// WriteSQL is [Writer.Write] for database/sql: it inserts msgs through tx,
// which should be the caller's transaction, and returns their message ids in
// the order of msgs. It passes only strings to the driver, so it works with
// github.com/jackc/pgx/v5/stdlib as well as other Postgres drivers, and
// inserts any number of messages in one statement.
func (w *Writer) WriteSQL(ctx context.Context, tx *sql.Tx, msgs ...Message) ([]string, error) {
	b, err := w.prepare(msgs)
	if err != nil || len(msgs) == 0 {
		return nil, err
	}
	res, err := tx.ExecContext(ctx, w.insertSQL,
		textArray(b.ids), textArray(b.topics), nullTextArray(b.keys), nullTextArray(b.headers), byteaArray(b.payloads))
	if err != nil {
		return nil, fmt.Errorf("insert into %s: %w", w.table, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return nil, fmt.Errorf("insert into %s: %w", w.table, err)
	}
	if n != int64(len(msgs)) {
		return nil, fmt.Errorf("write to %s: %d of %d rows inserted", w.table, n, len(msgs))
	}
	return b.ids, nil
}

func (w *Writer) identifier() pgx.Identifier {
	if w.table.Schema == "" {
		return pgx.Identifier{w.table.Name}
	}
	return pgx.Identifier{w.table.Schema, w.table.Name}
}

// batch is a validated batch of messages laid out by column.
type batch struct {
	ids      []string   // canonical text, returned to the caller
	uuids    [][16]byte // the same ids, for COPY
	topics   []string
	keys     []*string // nil is NULL
	headers  []*string // a JSON object; nil is NULL
	payloads [][]byte
}

// prepare validates msgs and lays them out by column, generating missing ids.
func (w *Writer) prepare(msgs []Message) (*batch, error) {
	b := &batch{
		ids:      make([]string, len(msgs)),
		uuids:    make([][16]byte, len(msgs)),
		topics:   make([]string, len(msgs)),
		keys:     make([]*string, len(msgs)),
		headers:  make([]*string, len(msgs)),
		payloads: make([][]byte, len(msgs)),
	}
	var given map[[16]byte]int // the given ids, to refuse one given twice
	for i, m := range msgs {
		if err := w.validate(m); err != nil {
			err.Index = i
			return nil, err
		}
		if m.ID == "" {
			b.uuids[i] = uuid.New()
		} else {
			b.uuids[i], _ = parseUUID(m.ID) // validated
			if given == nil {
				given = make(map[[16]byte]int)
			}
			if j, ok := given[b.uuids[i]]; ok {
				// The unique index would refuse it, aborting tx.
				return nil, &ValidationError{Index: i, Field: "id", Reason: fmt.Sprintf("%s is also message %d's", m.ID, j)}
			}
			given[b.uuids[i]] = i
		}
		b.ids[i] = uuid.UUID(b.uuids[i]).String()
		b.topics[i] = m.Topic
		if m.Key != "" {
			b.keys[i] = &m.Key
		}
		if len(m.Headers) > 0 {
			j, err := json.Marshal(m.Headers)
			if err != nil { // cannot happen for a map[string]string
				return nil, fmt.Errorf("encode headers of message %d: %w", i, err)
			}
			s := string(j)
			b.headers[i] = &s
		}
		b.payloads[i] = m.Payload
	}
	return b, nil
}

// textArray renders ss as a Postgres text[] literal.
func textArray(ss []string) string {
	var sb strings.Builder
	sb.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			sb.WriteByte(',')
		}
		quoteElem(&sb, s)
	}
	sb.WriteByte('}')
	return sb.String()
}

// nullTextArray renders ss as a Postgres text[] literal, nil elements as NULL.
func nullTextArray(ss []*string) string {
	var sb strings.Builder
	sb.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			sb.WriteByte(',')
		}
		if s == nil {
			sb.WriteString("NULL")
		} else {
			quoteElem(&sb, *s)
		}
	}
	sb.WriteByte('}')
	return sb.String()
}

// byteaArray renders bs as a Postgres bytea[] literal of hex-format
// elements: {"\\x0102",...}.
func byteaArray(bs [][]byte) string {
	const hex = "0123456789abcdef"
	var sb strings.Builder
	sb.WriteByte('{')
	for i, b := range bs {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(`"\\x`)
		for _, c := range b {
			sb.WriteByte(hex[c>>4])
			sb.WriteByte(hex[c&0x0f])
		}
		sb.WriteByte('"')
	}
	sb.WriteByte('}')
	return sb.String()
}

// quoteElem writes s as a double-quoted array element: inside the quotes
// only '"' and '\' need a backslash.
func quoteElem(sb *strings.Builder, s string) {
	sb.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			sb.WriteByte('\\')
		}
		sb.WriteByte(s[i])
	}
	sb.WriteByte('"')
}
