package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/schema"
)

// store holds the relay's SQL for one outbox table (package outboxsql).
type store struct {
	table schema.Table
	sql   *outboxsql.Statements
}

func newStore(t schema.Table) *store {
	return &store{table: t, sql: outboxsql.For(t)}
}

// keyWindow times the batch size is how many of the oldest keyed rows owed
// to a target a claim looks at for keys it may advance.
const keyWindow = 4

// claimed is one claimed row and what to do with it.
type claimed struct {
	msg       Message
	want      perTarget[bool]
	attempts  perTarget[int32]
	delivered perTarget[bool] // the target had the row before this batch
	badRow    string          // why the row can never be published (no topic, bad headers), or ""
	fresh     bool            // from the outbox (else from the owed table)
}

// snapshot is the claim statement's snapshot: the oldest transaction still
// running, the one after the newest ended, and the transactions running
// between them; the claim's own transaction id, taken just after the
// snapshot, which bounds the running ones from xmax up that the snapshot
// does not list; and what it showed of the outbox: the lowest keyed
// row above the keyed floor (0: none), or, to a sweep, the rows it saw and
// did not take; and of the owed table: its lowest unkeyed and keyed rows
// still owed above the owed floors (0: none).
type snapshot struct {
	xmin, xmax   int64
	xip          []int64
	xid          int64
	keyedLow     int64
	left         []int64
	owedLow      int64
	owedKeyedLow int64
}

// running reports whether transaction x had not ended at the snapshot: it
// is listed, or not below xmax (Postgres lists only the running ids below).
func (s snapshot) running(x int64) bool {
	return x >= s.xmax || (x >= s.xmin && slices.Contains(s.xip, x))
}

// unended returns the transactions that may have rows the snapshot does not
// show below rows it does: those it lists, and those from xmax up to the
// claim's own id. ok is false without that id, or with too many of them.
func (s snapshot) unended() (xs []int64, ok bool) {
	if s.xid == 0 || s.xid-s.xmax > maxPending {
		return nil, false
	}
	xs = slices.Clone(s.xip)
	for x := s.xmax; x < s.xid; x++ {
		xs = append(xs, x)
	}
	return xs, true
}

// batchSender is a connection that pipelines statements.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// claim begins a batch's transaction (outboxsql.BatchBegin) and claims up to
// limit rows per target, at most half of them keyed, in one round trip. The
// unkeyed walks start past fl (see claimFloor), and a sweep walks nothing
// else; held are keyed rows this relay's batches in flight hold, not tried.
func (s *store) claim(ctx context.Context, db batchSender, enabled, active phase, limit int, skipParked bool, fl floors, held []int64) ([]*claimed, snapshot, error) {
	var snap snapshot
	b := &pgx.Batch{}
	for _, q := range outboxsql.BatchBegin {
		b.Queue(q)
	}
	window, keyed, to := keyWindow*limit, max(1, limit/2), int64(math.MaxInt64)
	if fl.fresh.belowFloor { // the outbox's unkeyed rows only
		window, keyed, to = 0, 0, fl.fresh.to
	}
	if fl.fresh.recheck {
		b.Queue(s.sql.Recheck, pgx.StrictStructArgs(outboxsql.RecheckParams{
			AMQPActive: active.AMQP, NATSActive: active.NATS,
			From: fl.fresh.from, To: fl.fresh.to, HeldBefore: fl.fresh.ids, Limit: limit,
		}))
	} else {
		b.Queue(s.sql.Claim, pgx.StrictStructArgs(outboxsql.ClaimParams{
			AMQPActive: active.AMQP, NATSActive: active.NATS, AMQPEnabled: enabled.AMQP, NATSEnabled: enabled.NATS,
			BatchSize: limit, SkipParkedKeys: skipParked,
			KeyedWindow: window, KeyedRows: keyed, OwedFloor: fl.owed, OwedSafe: fl.owedSafe, OwedKeyedFloor: fl.owedKeyed, HeldIDs: held,
			FreshFrom: fl.fresh.from, FreshTo: to, Sweep: fl.fresh.belowFloor, KeyedFloor: fl.keyed,
			FreshKeyedFloor: fl.freshKeyed, KeyedPendingXIDs: fl.pendingXIDs, KeyedPendingFrom: fl.pendingFrom,
		}))
	}
	br := db.SendBatch(ctx, b)
	defer br.Close()
	for range outboxsql.BatchBegin {
		if _, err := br.Exec(); err != nil {
			return nil, snap, fmt.Errorf("begin batch: %w", err)
		}
	}
	rows, err := br.Query()
	if err != nil {
		return nil, snap, fmt.Errorf("claim batch: %w", err)
	}
	defer rows.Close()
	var out []*claimed
	for rows.Next() {
		c := &claimed{}
		var key, headers *string
		var exchange, routingKey, subject, stream *string
		var xmin, xmax, xid, keyedLow, owedLow, owedKeyedLow *int64
		var xip, left []int64
		if err := rows.Scan(&c.msg.ID, &c.msg.MessageID, &c.msg.Topic, &key, &headers, &c.msg.Payload,
			&c.msg.CreatedAt, &c.attempts.AMQP, &c.attempts.NATS, &c.delivered.AMQP, &c.delivered.NATS, &c.fresh,
			&exchange, &routingKey, &subject, &stream,
			&c.want.AMQP, &c.want.NATS, &xmin, &xmax, &xip, &xid, &keyedLow, &left, &owedLow, &owedKeyedLow); err != nil {
			return nil, snap, fmt.Errorf("claim batch: scan: %w", err)
		}
		if xmin != nil { // the statement's snapshot, not a row
			snap = snapshot{xmin: *xmin, xmax: *xmax, xip: xip, xid: deref(xid), left: left,
				keyedLow: deref(keyedLow), owedLow: deref(owedLow), owedKeyedLow: deref(owedKeyedLow)}
			continue
		}
		if key != nil {
			c.msg.Key, c.msg.HasKey = *key, true
		}
		if subject != nil { // the route it went by before
			c.msg.Route = &route.Dest{Exchange: deref(exchange), RoutingKey: deref(routingKey), Subject: *subject, Stream: deref(stream)}
		}
		switch {
		case c.msg.Topic == "":
			c.badRow = "topic: is empty"
		case headers != nil:
			c.msg.Headers, c.badRow = decodeHeaders(*headers)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, snap, fmt.Errorf("claim batch: %w", err)
	}
	rows.Close()
	// The walks come back one after the other, each in id order; the batch
	// is published in id order. Sorted here: an ORDER BY over the walks'
	// rows, payloads and all, costs Postgres much of the claim's time.
	slices.SortFunc(out, func(a, b *claimed) int { return cmp.Compare(a.msg.ID, b.msg.ID) })
	if err := br.Close(); err != nil {
		return nil, snap, fmt.Errorf("claim batch: %w", err)
	}
	return out, snap, nil
}

// deref is *p, or the zero value for nil (a NULL column).
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}

// decodeHeaders turns the headers column into a string map, or says why it
// cannot be one.
func decodeHeaders(raw string) (map[string]string, string) {
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return nil, "headers: not a JSON object"
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Sprintf("headers: value of %q is not a string", k)
		}
		out[k] = s
	}
	return out, ""
}

// Outcomes of one target for one row, as the record statement takes them
// (outboxsql.Outcome).
const (
	outcomeNone      = outboxsql.OutcomeNone
	outcomeDelivered = outboxsql.OutcomeDelivered
	outcomeRetry     = outboxsql.OutcomeRetry
	outcomeParked    = outboxsql.OutcomeParked
	outcomeOutage    = outboxsql.OutcomeOutage
)

// batchRecord collects a batch's outcomes column-wise for the record
// statement (outboxsql.RecordParams): rows
// still owed to an enabled target, and rows every enabled target now has.
type batchRecord struct {
	enabled phase // the targets a row must reach to be done

	ids     []int64
	outcome perTarget[[]outboxsql.Outcome]
	errText perTarget[[]string]
	backoff perTarget[[]int64] // milliseconds
	// the route each row went by (NULL: a sink's defaults): exchange,
	// routing key, subject, stream
	route [4][]*string

	doneIDs []int64
	doneNow perTarget[[]bool] // delivered in this batch (else before)
}

func newBatchRecord(n int, enabled phase) *batchRecord {
	return &batchRecord{enabled: enabled, ids: make([]int64, 0, n), doneIDs: make([]int64, 0, n)}
}

// add records one claimed row's outcomes.
func (b *batchRecord) add(c *claimed, outcome perTarget[outboxsql.Outcome], errText perTarget[string], backoff perTarget[time.Duration]) {
	done := true
	for _, t := range Targets {
		if b.enabled.Has(t) && !c.delivered.Get(t) && outcome.Get(t) != outcomeDelivered {
			done = false
		}
	}
	if done {
		b.doneIDs = append(b.doneIDs, c.msg.ID)
		for _, t := range Targets {
			appendTo(&b.doneNow, t, outcome.Get(t) == outcomeDelivered)
		}
		return
	}
	b.ids = append(b.ids, c.msg.ID)
	b.addRoute(c.msg.Route)
	for _, t := range Targets {
		appendTo(&b.outcome, t, outcome.Get(t))
		appendTo(&b.errText, t, errText.Get(t))
		appendTo(&b.backoff, t, backoff.Get(t).Milliseconds())
	}
}

// addRoute appends the route of the row last added to ids (nil: NULLs).
func (b *batchRecord) addRoute(d *route.Dest) {
	if d == nil {
		for i := range b.route {
			b.route[i] = append(b.route[i], nil)
		}
		return
	}
	for i, v := range []*string{&d.Exchange, &d.RoutingKey, &d.Subject, &d.Stream} {
		b.route[i] = append(b.route[i], v)
	}
}

// params are the record statement's parameters for b.
func (b *batchRecord) params() outboxsql.RecordParams {
	return outboxsql.RecordParams{
		IDs:          b.ids,
		AMQPOutcomes: b.outcome.AMQP, AMQPErrors: b.errText.AMQP, AMQPBackoffsMS: b.backoff.AMQP,
		NATSOutcomes: b.outcome.NATS, NATSErrors: b.errText.NATS, NATSBackoffsMS: b.backoff.NATS,
		RouteExchanges: b.route[0], RouteRoutingKeys: b.route[1], RouteSubjects: b.route[2], RouteStreams: b.route[3],
		DoneIDs: b.doneIDs, AMQPDoneNow: b.doneNow.AMQP, NATSDoneNow: b.doneNow.NATS,
	}
}

// recordLate records that target t has the rows of msgIDs (their confirms
// came after their batches gave up), in a transaction of its own: rows every
// enabled target now has leave the outbox as a batch's do. It returns how
// many rows it marked, and the lowest it moved from the outbox (-1: none).
//
// It waits for a row's lock at most lockWait: a batch in flight holds its
// rows for up to its publish timeout and its record.
//
// A row it moves from the outbox gets the route routes resolves for it (nil:
// none): this process published it, with these routes.
func (s *store) recordLate(ctx context.Context, pool *pgxpool.Pool, t Target, msgIDs []string, enabled phase, lockWait time.Duration, routes *route.Table) (marked int, moved int64, err error) {
	moved = -1
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, moved, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	lockTimeout := outboxsql.LockTimeoutParams{LockTimeout: fmt.Sprintf("%dms", lockWait.Milliseconds())}
	if _, err := tx.Exec(ctx, outboxsql.LockTimeout, pgx.StrictStructArgs(lockTimeout)); err != nil {
		return 0, moved, err
	}
	late := outboxsql.LateParams{MessageIDs: msgIDs}
	if _, err := tx.Exec(ctx, s.sql.LateWait, pgx.StrictStructArgs(late)); err != nil {
		return 0, moved, err
	}
	rows, err := tx.Query(ctx, s.sql.Late.Get(string(t)), pgx.StrictStructArgs(late))
	if err != nil {
		return 0, moved, err
	}
	done := newBatchRecord(0, enabled)
	routed := newBatchRecord(0, enabled) // the moved rows still owed, and their routes
	for rows.Next() {
		var id int64
		var has perTarget[bool]
		var topic, headers *string
		if err := rows.Scan(&id, &has.AMQP, &has.NATS, &topic, &headers); err != nil {
			rows.Close()
			return 0, moved, err
		}
		marked++
		if topic != nil && (moved < 0 || id < moved) { // moved from the outbox
			moved = id
		}
		if topic != nil && routes != nil {
			var h map[string]string
			if headers != nil {
				h, _ = decodeHeaders(*headers)
			}
			d, _ := routes.Resolve(*topic, h)
			routed.ids = append(routed.ids, id)
			routed.addRoute(&d)
		}
		if (has.AMQP || !enabled.AMQP) && (has.NATS || !enabled.NATS) {
			done.doneIDs = append(done.doneIDs, id)
			done.doneNow.AMQP = append(done.doneNow.AMQP, false)
			done.doneNow.NATS = append(done.doneNow.NATS, false)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, moved, err
	}
	if len(routed.ids) > 0 {
		if _, err := tx.Exec(ctx, s.sql.LateRoute, pgx.StrictStructArgs(outboxsql.LateRouteParams{
			IDs: routed.ids, RouteExchanges: routed.route[0], RouteRoutingKeys: routed.route[1],
			RouteSubjects: routed.route[2], RouteStreams: routed.route[3],
		})); err != nil {
			return 0, moved, err
		}
	}
	if len(done.doneIDs) > 0 {
		if _, err := tx.Exec(ctx, s.sql.Record, pgx.StrictStructArgs(done.params())); err != nil {
			return 0, moved, err
		}
	}
	if moved >= 0 { // rows the other relays' owed floors may have passed
		if err := notify(ctx, tx, s.table, moved); err != nil {
			return 0, moved, err
		}
	}
	return marked, moved, tx.Commit(ctx)
}

// record writes a batch's outcomes and commits its transaction, in one
// round trip.
func (s *store) record(ctx context.Context, db batchSender, b *batchRecord) error {
	q := &pgx.Batch{}
	q.Queue(s.sql.Record, pgx.StrictStructArgs(b.params()))
	q.Queue("COMMIT")
	br := db.SendBatch(ctx, q)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("record batch: %w", err)
	}
	if _, err := br.Exec(); err != nil {
		return fmt.Errorf("commit batch: %w", err)
	}
	if err := br.Close(); err != nil {
		return fmt.Errorf("record batch: %w", err)
	}
	return nil
}
