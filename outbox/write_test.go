package outbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

// Everything Write documents as accepted.
var (
	_ PgxTx = pgx.Tx(nil)
	_ PgxTx = (*pgx.Conn)(nil)
	_ PgxTx = (*pgxpool.Pool)(nil)
	_ PgxTx = (*pgxpool.Conn)(nil)
)

type env struct {
	pool  *pgxpool.Pool
	db    *sql.DB
	table schema.Table
	w     *Writer
}

// setup gives the test its own outbox table and a Writer for it.
func setup(t *testing.T) *env {
	t.Helper()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	db := stdlib.OpenDBFromPool(pool)
	t.Cleanup(func() { db.Close() })
	w, err := New(Config{Table: table.String(), MaxPayload: 1 << 20})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return &env{pool: pool, db: db, table: table, w: w}
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// A path is one way of writing: Write in a pgx.Tx or WriteSQL in a *sql.Tx.
type path struct {
	name  string
	begin func(t *testing.T, e *env) txn
}

// txn is a transaction of one path, rolled back at the end of the test
// unless committed.
type txn struct {
	write  func(msgs ...Message) ([]string, error)
	commit func() error
}

var paths = []path{
	{"pgx", func(t *testing.T, e *env) txn {
		ctx := testCtx(t)
		tx, err := e.pool.Begin(ctx)
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck // after Commit it is a no-op
		return txn{
			write:  func(msgs ...Message) ([]string, error) { return e.w.Write(ctx, tx, msgs...) },
			commit: func() error { return tx.Commit(ctx) },
		}
	}},
	{"sql", func(t *testing.T, e *env) txn {
		ctx := testCtx(t)
		tx, err := e.db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatalf("begin: %v", err)
		}
		t.Cleanup(func() { tx.Rollback() }) //nolint:errcheck // after Commit it is a no-op
		return txn{
			write:  func(msgs ...Message) ([]string, error) { return e.w.WriteSQL(ctx, tx, msgs...) },
			commit: tx.Commit,
		}
	}},
}

// write writes msgs in one transaction of p, committed if commit is set and
// rolled back otherwise.
func (e *env) write(t *testing.T, p path, commit bool, msgs ...Message) ([]string, error) {
	t.Helper()
	tx := p.begin(t, e)
	ids, err := tx.write(msgs...)
	if err != nil || !commit {
		return ids, err
	}
	return ids, tx.commit()
}

// row is an outbox row as a producer wrote it.
type row struct {
	ID      string
	Topic   string
	Key     *string
	Headers map[string]string // nil for NULL
	Payload []byte
}

func (r row) String() string {
	key := "NULL"
	if r.Key != nil {
		key = fmt.Sprintf("%q", *r.Key)
	}
	return fmt.Sprintf("{id %s topic %q key %s headers %v payload %q}", r.ID, r.Topic, key, r.Headers, r.Payload)
}

// rows reads the table in id order, checking that headers are NULL or an
// object.
func (e *env) rows(t *testing.T) []row {
	t.Helper()
	ctx := testCtx(t)
	pgRows, err := e.pool.Query(ctx, `SELECT message_id::text, topic, key, headers, payload,
		headers IS NULL OR jsonb_typeof(headers) = 'object' FROM `+e.table.Ident()+` ORDER BY id`)
	if err != nil {
		t.Fatalf("query rows: %v", err)
	}
	var out []row
	for pgRows.Next() {
		var r row
		var object bool
		if err := pgRows.Scan(&r.ID, &r.Topic, &r.Key, &r.Headers, &r.Payload, &object); err != nil {
			t.Fatalf("scan row: %v", err)
		}
		if !object {
			t.Fatalf("row %s: headers are not a JSON object", r.ID)
		}
		out = append(out, r)
	}
	if err := pgRows.Err(); err != nil {
		t.Fatalf("read rows: %v", err)
	}
	return out
}

// wantRows checks that the table holds exactly msgs, in order, with ids.
func (e *env) wantRows(t *testing.T, msgs []Message, ids []string) {
	t.Helper()
	got := e.rows(t)
	if len(got) != len(msgs) || len(ids) != len(msgs) {
		t.Fatalf("got %d rows and %d ids for %d messages", len(got), len(ids), len(msgs))
	}
	for i, m := range msgs {
		want := row{ID: ids[i], Topic: m.Topic, Payload: m.Payload}
		if m.Key != "" {
			want.Key = &m.Key
		}
		if len(m.Headers) > 0 {
			want.Headers = m.Headers
		}
		r := got[i]
		if r.ID != want.ID || r.Topic != want.Topic || !equalPtr(r.Key, want.Key) ||
			!maps.Equal(r.Headers, want.Headers) || (r.Headers == nil) != (want.Headers == nil) ||
			!bytes.Equal(r.Payload, want.Payload) || r.Payload == nil {
			t.Fatalf("row %d = %v, want %v", i, r, want)
		}
	}
}

func equalPtr(a, b *string) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// batchOf returns n messages varying every optional field.
func batchOf(n int) []Message {
	msgs := make([]Message, n)
	for i := range msgs {
		m := Message{Topic: fmt.Sprintf("orders.%d", i), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
		if i%2 == 0 {
			m.Key = fmt.Sprintf("k%d", i%7)
		}
		if i%3 == 0 {
			m.Headers = map[string]string{"n": fmt.Sprint(i), "Content-Type": "application/json"}
		}
		if i%5 == 0 {
			m.Payload = []byte{}
		}
		msgs[i] = m
	}
	return msgs
}

func TestWriteOne(t *testing.T) {
	t.Parallel()
	for _, p := range paths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			e := setup(t)
			msg := Message{Topic: "orders.created", Key: "order-42", Headers: map[string]string{"a": "b"}, Payload: []byte("hi")}
			ids, err := e.write(t, p, true, msg)
			if err != nil {
				t.Fatalf("write: %v", err)
			}
			if len(ids) != 1 {
				t.Fatalf("got ids %v, want 1", ids)
			}
			u, ok := parseUUID(ids[0])
			if !ok || formatUUID(u) != ids[0] || u[6]>>4 != 4 || u[8]>>6 != 2 {
				t.Fatalf("id %q is not a canonical version 4 UUID", ids[0])
			}
			e.wantRows(t, []Message{msg}, ids)
		})
	}
}

// Sizes straddle copyThreshold, where Write switches from INSERT to COPY.
func TestWriteMany(t *testing.T) {
	t.Parallel()
	for _, p := range paths {
		for _, n := range []int{2, copyThreshold - 1, copyThreshold, 1000} {
			t.Run(fmt.Sprintf("%s/%d", p.name, n), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				msgs := batchOf(n)
				ids, err := e.write(t, p, true, msgs...)
				if err != nil {
					t.Fatalf("write: %v", err)
				}
				e.wantRows(t, msgs, ids)
				seen := make(map[string]bool)
				for _, id := range ids {
					if seen[id] {
						t.Fatalf("id %s returned twice", id)
					}
					seen[id] = true
				}
			})
		}
	}
}

func TestWriteEmpty(t *testing.T) {
	t.Parallel()
	w, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	// Nothing to write: the nil transactions are never touched.
	if ids, err := w.Write(t.Context(), nil); ids != nil || err != nil {
		t.Fatalf("Write() = %v, %v; want nil, nil", ids, err)
	}
	if ids, err := w.WriteSQL(t.Context(), nil); ids != nil || err != nil {
		t.Fatalf("WriteSQL() = %v, %v; want nil, nil", ids, err)
	}
}

func TestWriteRollback(t *testing.T) {
	t.Parallel()
	for _, p := range paths {
		for _, n := range []int{1, copyThreshold} {
			t.Run(fmt.Sprintf("%s/%d", p.name, n), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				if _, err := e.write(t, p, false, batchOf(n)...); err != nil {
					t.Fatalf("write: %v", err)
				}
				if rows := e.rows(t); len(rows) != 0 {
					t.Fatalf("after rollback the table holds %d rows, want 0", len(rows))
				}
			})
		}
	}
}

// Outside a transaction, through a pool or a connection, each Write commits.
func TestWriteAutocommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := testCtx(t)
	conn, err := e.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var ids []string
	for _, tx := range []PgxTx{e.pool, conn, conn.Conn()} {
		got, err := e.w.Write(ctx, tx, Message{Topic: "t", Payload: []byte{}})
		if err != nil {
			t.Fatalf("write through %T: %v", tx, err)
		}
		ids = append(ids, got...)
	}
	e.wantRows(t, []Message{{Topic: "t", Payload: []byte{}}, {Topic: "t", Payload: []byte{}}, {Topic: "t", Payload: []byte{}}}, ids)
}

func TestWriteGivenIDs(t *testing.T) {
	t.Parallel()
	for _, p := range paths {
		for _, n := range []int{3, copyThreshold} {
			t.Run(fmt.Sprintf("%s/%d", p.name, n), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				msgs := batchOf(n)
				msgs[0].ID = "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f80"
				msgs[1].ID = "0190A5D2-7C1E-4B8E-9A2F-3D4C5B6A7F81" // returned lower-case, as stored
				ids, err := e.write(t, p, true, msgs...)
				if err != nil {
					t.Fatalf("write: %v", err)
				}
				if ids[0] != "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f80" || ids[1] != "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f81" {
					t.Fatalf("got ids %v, want the given ones first", ids[:2])
				}
				if _, ok := parseUUID(ids[2]); !ok {
					t.Fatalf("generated id %q is not a UUID", ids[2])
				}
				e.wantRows(t, msgs, ids)
			})
		}
	}
}

func TestWriteDuplicateID(t *testing.T) {
	t.Parallel()
	const id = "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f80"
	for _, p := range paths {
		for _, n := range []int{1, copyThreshold} {
			t.Run(fmt.Sprintf("%s/%d", p.name, n), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				first := []Message{{ID: id, Topic: "t", Payload: []byte("first")}}
				if _, err := e.write(t, p, true, first...); err != nil {
					t.Fatalf("first write: %v", err)
				}
				msgs := batchOf(n)
				msgs[n-1].ID = id
				_, err := e.write(t, p, true, msgs...)
				var pgErr *pgconn.PgError
				if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
					t.Fatalf("second write: got %v, want a unique violation (23505)", err)
				}
				e.wantRows(t, first, []string{id})
			})
		}
	}
}

// Strings that need escaping in an array literal, and bytes that need it in
// bytea, come back as written.
func TestWriteAwkwardValues(t *testing.T) {
	t.Parallel()
	awkward := []string{`"`, `\`, `\\"`, "NULL", "null", "{a,b}", ` a b `, "'; --", "ключ", "🙂", "\t"}
	for _, p := range paths {
		for _, n := range []int{len(awkward), copyThreshold} {
			t.Run(fmt.Sprintf("%s/%d", p.name, n), func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				msgs := batchOf(n)
				for i, s := range awkward {
					msgs[i].Key = s
					msgs[i].Headers = map[string]string{"X-" + fmt.Sprint(i): s, "Empty": ""}
					msgs[i].Payload = []byte(s + "\x00\xff\\x00")
				}
				ids, err := e.write(t, p, true, msgs...)
				if err != nil {
					t.Fatalf("write: %v", err)
				}
				e.wantRows(t, msgs, ids)
			})
		}
	}
}

// Every invalid batch is refused before anything is sent, so the caller's
// transaction stays usable and nothing is written.
func TestWriteInvalid(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		msg   Message
		field string
	}{
		{"id not a uuid", Message{ID: "42", Topic: "t", Payload: []byte{}}, "id"},
		{"id without hyphens", Message{ID: "0190a5d27c1e4b8e9a2f3d4c5b6a7f80", Topic: "t", Payload: []byte{}}, "id"},
		{"id in braces", Message{ID: "{0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7f8}", Topic: "t", Payload: []byte{}}, "id"},
		{"id not hex", Message{ID: "0190a5d2-7c1e-4b8e-9a2f-3d4c5b6a7fxx", Topic: "t", Payload: []byte{}}, "id"},
		{"empty topic", Message{Payload: []byte{}}, "topic"},
		{"wildcard topic", Message{Topic: "orders.*", Payload: []byte{}}, "topic"},
		{"topic with space", Message{Topic: "orders created", Payload: []byte{}}, "topic"},
		{"topic empty token", Message{Topic: "orders..created", Payload: []byte{}}, "topic"},
		{"key with NUL", Message{Topic: "t", Key: "a\x00b", Payload: []byte{}}, "key"},
		{"key not UTF-8", Message{Topic: "t", Key: "\xff", Payload: []byte{}}, "key"},
		{"header key with colon", Message{Topic: "t", Headers: map[string]string{"a:b": "c"}, Payload: []byte{}}, "headers"},
		{"header value with newline", Message{Topic: "t", Headers: map[string]string{"a": "b\nc"}, Payload: []byte{}}, "headers"},
		{"reserved header", Message{Topic: "t", Headers: map[string]string{"nats-msg-id": "x"}, Payload: []byte{}}, "headers"},
		{"key of 1,025 bytes", Message{Topic: "t", Key: strings.Repeat("k", 1025), Payload: []byte{}}, "key"},
		{"headers of 65,537 bytes", Message{Topic: "t", Headers: map[string]string{"a": strings.Repeat("a", 32<<10), "b": strings.Repeat("b", 32<<10)}, Payload: []byte{}}, "headers"},
		{"nil payload", Message{Topic: "t"}, "payload"},
		{"payload too large", Message{Topic: "t", Payload: make([]byte, 1<<20+1)}, "payload"},
		// What NATS counts against max_payload: the headers and the
		// relay's own too.
		{"payload too large with the headers", Message{Topic: "t", Headers: map[string]string{"content-type": "application/json"}, Payload: make([]byte, 1<<20-512-20)}, "payload"},
	} {
		for _, p := range paths {
			t.Run(tc.name+"/"+p.name, func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				tx := p.begin(t, e)
				// The bad message comes last, after valid ones, in a batch
				// for INSERT and one for COPY.
				for _, n := range []int{1, copyThreshold} {
					_, err := tx.write(append(batchOf(n-1), tc.msg)...)
					if !errors.Is(err, ErrInvalidMessage) {
						t.Fatalf("%d messages: got %v, want ErrInvalidMessage", n, err)
					}
					var ve *ValidationError
					if !errors.As(err, &ve) || ve.Index != n-1 || ve.Field != tc.field {
						t.Fatalf("%d messages: got %#v, want a *ValidationError for message %d, field %s", n, err, n-1, tc.field)
					}
				}
				// The transaction goes on; only what follows is written.
				ok := []Message{{Topic: "ok", Payload: []byte{}}}
				ids, err := tx.write(ok...)
				if err != nil {
					t.Fatalf("write after refused write: %v", err)
				}
				if err := tx.commit(); err != nil {
					t.Fatalf("commit after refused write: %v", err)
				}
				e.wantRows(t, ok, ids)
			})
		}
	}
}

// The table's statement trigger wakes listeners on commit, for INSERT and
// COPY alike, while a relay waits for rows (holds the table's wake lock),
// and queues no NOTIFY otherwise.
func TestWriteNotifies(t *testing.T) {
	t.Parallel()
	for _, p := range paths {
		for _, n := range []int{1, copyThreshold} {
			for _, waiting := range []bool{true, false} {
				t.Run(fmt.Sprintf("%s/%d/relay waiting %v", p.name, n, waiting), func(t *testing.T) {
					t.Parallel()
					e := setup(t)
					listener := testenv.Listen(t, testenv.DatabaseURL(t), e.table.Channel())
					if waiting {
						listener.Exec(t, "SELECT pg_advisory_lock($1)", e.table.WakeLock())
					}
					if _, err := e.write(t, p, true, batchOf(n)...); err != nil {
						t.Fatalf("write: %v", err)
					}
					got := listener.Received(t)
					want := []string{}
					if waiting {
						want = []string{e.table.Channel()}
					}
					if !slices.Equal(got, want) {
						t.Fatalf("notifications on %q, want %q", got, want)
					}
				})
			}
		}
	}
}
