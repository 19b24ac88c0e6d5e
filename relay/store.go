package relay

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/schema"
)

// store holds the relay's SQL for one outbox table. Every statement is built
// once from the validated, quoted table identifier; values always travel as
// parameters.
type store struct {
	claimSQL  string
	recordSQL string
	// lateSQL marks rows delivered to a target whose confirm came after
	// their batch gave up waiting.
	lateSQL    perTarget[string]
	cleanupSQL string
	// cleanupDeliveredSQL trims the record of delivered ids.
	cleanupDeliveredSQL string
	// cleanupBackfilledSQL trims the backfill's record of moved ids.
	cleanupBackfilledSQL string
	// finishSQL moves out of the outbox, a slice at a time, rows
	// JetStream has that no batch will: see Relay.finishStranded.
	finishSQL string
}

func newStore(t schema.Table) *store {
	tbl := t.Ident()
	return &store{
		claimSQL: claimSQL(tbl),
		// One statement records a whole batch, in two parts.
		//
		// Rows still owed to an enabled target are updated ($1..$7). Per
		// target and row, the outcome is 0 not attempted, 1 delivered, 2
		// failed (retry after the backoff), 3 parked, 4 broker unavailable
		// (retry after the backoff, not counted as an attempt: an outage
		// must not use up MaxAttempts).
		//
		// Rows every enabled target now has ($8..$10: id, and per target
		// whether it was delivered in this batch) are deleted and their ids
		// written to the delivered table: a delete and a narrow insert cost
		// Postgres a fraction of rewriting the whole row (migration 00005).
		// amqp_sent: RabbitMQ may have the row (delivered, or published
		// at least once: an attempt, or an outage such as a confirm that
		// never came, leaves an error). Only such rows can be in the legacy
		// queue, so only they enter the message_id index the backfill reads
		// (migration 00006).
		// The caller tells the two apart from the claimed row versions,
		// which this transaction holds locked, so they cannot have changed.
		recordSQL: fmt.Sprintf(`
WITH upd AS (
	UPDATE %[1]s o SET
		amqp_delivered_at = CASE WHEN u.a = 1 THEN clock_timestamp() ELSE o.amqp_delivered_at END,
		amqp_attempts     = o.amqp_attempts + (u.a IN (1, 2, 3))::int,
		amqp_retry_at     = CASE WHEN u.a IN (2, 4) THEN clock_timestamp() + u.ab * interval '1 millisecond' WHEN u.a = 1 THEN NULL ELSE o.amqp_retry_at END,
		amqp_parked_at    = CASE WHEN u.a = 3 THEN clock_timestamp() ELSE o.amqp_parked_at END,
		amqp_last_error   = CASE WHEN u.a IN (2, 3, 4) THEN u.ae ELSE o.amqp_last_error END,
		nats_delivered_at = CASE WHEN u.n = 1 THEN clock_timestamp() ELSE o.nats_delivered_at END,
		nats_attempts     = o.nats_attempts + (u.n IN (1, 2, 3))::int,
		nats_retry_at     = CASE WHEN u.n IN (2, 4) THEN clock_timestamp() + u.nb * interval '1 millisecond' WHEN u.n = 1 THEN NULL ELSE o.nats_retry_at END,
		nats_parked_at    = CASE WHEN u.n = 3 THEN clock_timestamp() ELSE o.nats_parked_at END,
		nats_last_error   = CASE WHEN u.n IN (2, 3, 4) THEN u.ne ELSE o.nats_last_error END
	FROM unnest($1::bigint[], $2::smallint[], $3::text[], $4::bigint[], $5::smallint[], $6::text[], $7::bigint[])
		AS u(id, a, ae, ab, n, ne, nb)
	WHERE o.id = u.id
), del AS (
	DELETE FROM %[1]s o USING unnest($8::bigint[], $9::boolean[], $10::boolean[]) AS d(id, a, n)
	WHERE o.id = d.id
	RETURNING o.message_id, o.id,
		CASE WHEN d.a THEN clock_timestamp() ELSE o.amqp_delivered_at END AS amqp_at,
		CASE WHEN d.n THEN clock_timestamp() ELSE o.nats_delivered_at END AS nats_at,
		d.a OR o.amqp_delivered_at IS NOT NULL OR o.amqp_attempts > 0 OR o.amqp_last_error IS NOT NULL AS amqp_sent
)
INSERT INTO %[2]s (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, done_at)
SELECT id, message_id, amqp_at, nats_at, amqp_sent, clock_timestamp() FROM del`, tbl, t.Delivered()),

		lateSQL: perTarget[string]{AMQP: lateSQL(tbl, "amqp"), NATS: lateSQL(tbl, "nats")},

		// The next slice of the outbox in id order, past $1, at most $2
		// rows (the primary key's order: no scan of the whole table, which
		// during a backlog holds millions); of them, the rows JetStream has
		// (the nats-only phase: see Relay.finishStranded). It returns the
		// slice's last id, its rows, and the rows finished.
		finishSQL: fmt.Sprintf(`
WITH slice AS MATERIALIZED (
	SELECT id FROM %[1]s WHERE id > $1 ORDER BY id LIMIT $2
), del AS (
	DELETE FROM %[1]s o WHERE o.id IN (
		SELECT id FROM %[1]s WHERE id IN (SELECT id FROM slice) AND nats_delivered_at IS NOT NULL AND done_at IS NULL
		FOR UPDATE SKIP LOCKED)
	RETURNING o.message_id, o.id, o.amqp_delivered_at, o.nats_delivered_at,
		o.amqp_delivered_at IS NOT NULL OR o.amqp_attempts > 0 OR o.amqp_last_error IS NOT NULL AS amqp_sent
), ins AS (
	INSERT INTO %[2]s (id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, done_at)
	SELECT id, message_id, amqp_delivered_at, nats_delivered_at, amqp_sent, clock_timestamp() FROM del
)
SELECT coalesce((SELECT max(id) FROM slice), 0), (SELECT count(*) FROM slice), (SELECT count(*) FROM del)`, tbl, t.Delivered()),

		// Rows marked done in the outbox by relayd before migration 00005.
		cleanupSQL: fmt.Sprintf(`
DELETE FROM %[1]s WHERE id IN (
	SELECT id FROM %[1]s WHERE done_at < now() - $1 * interval '1 millisecond'
	ORDER BY done_at LIMIT $2 FOR UPDATE SKIP LOCKED)`, tbl),

		cleanupDeliveredSQL: fmt.Sprintf(`
DELETE FROM %[1]s WHERE (done_at, id) IN (
	SELECT done_at, id FROM %[1]s WHERE done_at < now() - $1 * interval '1 millisecond'
	ORDER BY done_at LIMIT $2)`, t.Delivered()),

		cleanupBackfilledSQL: fmt.Sprintf(`
DELETE FROM %[1]s WHERE message_id IN (
	SELECT message_id FROM %[1]s WHERE moved_at < now() - $1 * interval '1 millisecond'
	ORDER BY moved_at LIMIT $2)`, t.Backfilled()),
	}
}

// lateSQL marks the rows of message ids $1 delivered to target p, unless
// they are already, and returns each row's id and whether each target has
// it now. The rows are locked in id order, so that two instances recording
// overlapping sets wait for each other instead of deadlocking; a row in a
// batch in flight is waited for (its batch records first). A parked row is
// unparked: the broker has it.
func lateSQL(tbl, p string) string {
	return fmt.Sprintf(`
UPDATE %[1]s o SET %[2]s_delivered_at = clock_timestamp(), %[2]s_retry_at = NULL, %[2]s_parked_at = NULL, %[2]s_last_error = NULL
FROM (SELECT id FROM %[1]s WHERE message_id = ANY ($1::uuid[]) AND %[2]s_delivered_at IS NULL AND done_at IS NULL ORDER BY id FOR UPDATE) l
WHERE o.id = l.id
RETURNING o.id, o.amqp_delivered_at IS NOT NULL, o.nats_delivered_at IS NOT NULL`, tbl, p)
}

// claimSQL claims a batch. Parameters: $1 and $2 whether amqp and nats are
// active, $3 the batch size, $4 skip parked keys, $5 the keyed window (see
// below), $6 the most keyed rows a batch takes per target, $7 the floor of
// the unkeyed walks (see Relay.claimFloor; 0 walks from the oldest row), $8
// the keyed rows this relay's batches in flight hold (see Relay.held).
// RabbitMQ gets at most $3 rows a batch: keyed ones first (at most $6), then
// unkeyed ones, so neither kind can starve the other.
//
// Per target, two walks, each over its own partial index in id order and
// locking what it returns (SKIP LOCKED: rows another relay holds are left to
// it); neither walks past the other's rows:
//
//   - unkeyed rows: every pending row is claimable;
//   - keyed rows: a row may go to a target only when no earlier row of its
//     key is still owed to that target (in retry, in flight in another
//     relay's batch, or — unless $4, skip parked — parked). Such a row is the
//     first row of its key owed to the target, of a key not held by a row
//     whose retry is not due yet or (unless $4) that is parked. The claim
//     looks for these among the oldest $5 keyed rows owed to the target,
//     leaving out held keys: a prefix of them in id order, so the first row
//     of a key in it is the first of its key. The heads and the locks come
//     from one statement, one snapshot: a later row of a key is a candidate
//     only when the earlier one is delivered in that snapshot — its confirm
//     came first — and a head another relay holds is skipped (and its key
//     with it), one it recorded meanwhile fails claimable on the locked
//     version. The window bounds the cost of a claim that finds every key
//     busy (first rows in flight elsewhere) to $5 index entries instead of
//     the whole backlog; rows past it wait only while the rows before them
//     are in flight. A key's first row in flight is still its head (it
//     holds the key), but the rows in $8 are not tried: this relay's other
//     batches hold them, and with few keys most heads are in flight — each
//     claim tried to lock every one of them before reaching a free key
//     (with 750 of 1,000 heads in flight, 9.6 ms and 8,591 buffers for a
//     claim of 250 rows; without trying them, 5.5 ms and 2,484).
//
// The want_* flags are computed in the locking SELECT, so they describe the
// row version that was locked and not an older snapshot: a target another
// relay just recorded is never published again.
//
// With both targets active, a row goes to both in the same batch and is
// recorded once. The nats walks add only the rows RabbitMQ does not want now
// (delivered, parked, in retry or held by its key) below the amqp walk's last
// row, unless that walk came back short: JetStream catches up on its own
// backlog at full speed, but does not run ahead of RabbitMQ, which would
// claim and rewrite each row twice. An unkeyed row RabbitMQ could take is in
// a_u or locked by another batch (a_u took every other one up to its last
// row, or to the end), so n_u does not try its lock again: with batches in
// flight, those lock attempts were much of a short claim's work. A target that is down or paused is left
// out ($1/$2 false), and the other then runs alone. A row that is RabbitMQ's
// next of its key too is left to the amqp walk (which took it, or another
// relay holds it for both).
func claimSQL(tbl string) string {
	claimable := func(p string) string {
		return fmt.Sprintf(`%[1]s AND (%[2]s_retry_at IS NULL OR %[2]s_retry_at <= now())`, owed(p), p)
	}
	// heads: the first row of each key among the oldest $5 keyed rows owed
	// to p, leaving out keys held by a row whose retry is not due yet or
	// (unless $4) parked; the key_waiting index holds just those rows.
	// min(id) by key, hashed: DISTINCT ON (key) sorted the window by key
	// first (EXPLAIN ANALYZE, 1,000 keys, a window of 2,000 rows: the
	// claim took 4.0–5.1 ms with the sort, 3.2–4.4 ms without).
	//
	// A window that a few keys fill — a bulk job's thousands of rows of one
	// key ahead of the rest — holds few heads, and those mostly in flight:
	// the keys after it waited until its backlog was down to a window's
	// worth, one row per batch round trip (minutes). Such a window (fewer
	// than one distinct key in four rows) is topped up with the first row
	// of the keys it does not hold, found by a skip scan of the key_pending
	// index in key order — one descent per key, whatever the backlog of the
	// keys skipped — at most 2 × $6 keys a claim. Every row of such a key is
	// past the window (the window takes the oldest), so its first row in
	// the index is its first owed — or parked, or in retry, and then its
	// key is held and left out as in the window. With $4 (skip parked
	// keys) the scan passes a key's parked rows, to its first owed.
	heads := func(p, enabled, bound string) string {
		active := enabled
		if bound != "" {
			active += " AND " + bound
		}
		waiting := fmt.Sprintf(`SELECT key FROM %[1]s WHERE key IS NOT NULL AND %[2]s_delivered_at IS NULL AND done_at IS NULL
		                    AND (%[2]s_retry_at IS NOT NULL OR %[2]s_parked_at IS NOT NULL)
		                    AND ((%[2]s_parked_at IS NULL AND %[2]s_retry_at > now()) OR (%[2]s_parked_at IS NOT NULL AND NOT $4::boolean))`, tbl, p)
		return fmt.Sprintf(`WITH RECURSIVE w AS MATERIALIZED (
		SELECT key, min(id) AS id, count(*) AS n FROM (
			SELECT id, key FROM %[1]s WHERE %[3]s AND key IS NOT NULL AND %[4]s
			  AND key NOT IN (%[5]s)
			ORDER BY id LIMIT $5) r
		GROUP BY key
	), ks(key, id, n) AS (
		SELECT k.key, k.id, 1 FROM (
			SELECT key, id FROM %[1]s WHERE key IS NOT NULL AND %[2]s_delivered_at IS NULL AND done_at IS NULL
			  AND (NOT $4::boolean OR %[2]s_parked_at IS NULL)
			ORDER BY key, id LIMIT 1) k
		WHERE %[6]s AND (SELECT sum(n) >= $5 AND count(*) * 4 < $5 FROM w)
		UNION ALL
		SELECT k.key, k.id, ks.n + 1 FROM ks CROSS JOIN LATERAL (
			SELECT key, id FROM %[1]s WHERE key IS NOT NULL AND key > ks.key AND %[2]s_delivered_at IS NULL AND done_at IS NULL
			  AND (NOT $4::boolean OR %[2]s_parked_at IS NULL)
			ORDER BY key, id LIMIT 1) k
		WHERE ks.n < $6 * 2
	)
	SELECT id FROM w
	UNION ALL
	SELECT id FROM ks WHERE %[3]s AND key NOT IN (SELECT key FROM w) AND key NOT IN (%[5]s)`, tbl, p, active, owed(p), waiting, enabled)
	}
	// bound: the nats walks stay below the amqp walk of the same kind when
	// that came back full.
	bound := func(a, limit string) string {
		return fmt.Sprintf(`id < CASE WHEN $1::boolean AND (SELECT count(*) FROM %[1]s) >= %[2]s THEN (SELECT max(id) FROM %[1]s)
	                ELSE 9223372036854775807 END`, a, limit)
	}
	// natsFree: no earlier row of the key is owed to nats (for a row the
	// amqp walk took: whether it goes to nats in the same batch).
	natsFree := fmt.Sprintf(`NOT EXISTS (
		SELECT 1 FROM %[1]s e WHERE e.key = %[1]s.key AND e.id < %[1]s.id
		  AND e.nats_delivered_at IS NULL AND e.done_at IS NULL
		  AND (NOT $4::boolean OR e.nats_parked_at IS NULL))`, tbl)
	const cols = `id, message_id::text, topic, key, headers::text, payload, created_at, amqp_attempts, nats_attempts,
		amqp_delivered_at IS NOT NULL, nats_delivered_at IS NOT NULL`
	return fmt.Sprintf(`
WITH h_a AS MATERIALIZED (%[5]s
), a_k AS (
	SELECT %[2]s, true AS want_amqp, ($2::boolean AND %[4]s AND %[8]s) AS want_nats
	FROM %[1]s WHERE id = ANY (ARRAY(SELECT id FROM h_a EXCEPT SELECT unnest($8::bigint[]))) AND key IS NOT NULL AND %[3]s
	ORDER BY id LIMIT $6 FOR UPDATE SKIP LOCKED
), a_u AS (
	SELECT %[2]s, true AS want_amqp, ($2::boolean AND %[4]s) AS want_nats
	FROM %[1]s WHERE $1::boolean AND key IS NULL AND %[3]s AND id > $7::bigint
	ORDER BY id LIMIT $3 - (SELECT count(*) FROM a_k) FOR UPDATE SKIP LOCKED
), h_n AS MATERIALIZED (%[6]s
), n_u AS (
	SELECT %[2]s, false AS want_amqp, true AS want_nats
	FROM %[1]s WHERE $2::boolean AND key IS NULL AND %[4]s AND id > $7::bigint AND id NOT IN (SELECT id FROM a_u) AND %[7]s
	  AND NOT ($1::boolean AND %[3]s)
	ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED
), n_k AS (
	SELECT %[2]s, false AS want_amqp, true AS want_nats
	FROM %[1]s WHERE id = ANY (ARRAY(SELECT id FROM h_n EXCEPT SELECT id FROM h_a EXCEPT SELECT unnest($8::bigint[]))) AND key IS NOT NULL AND %[4]s
	  AND id NOT IN (SELECT id FROM a_k)
	ORDER BY id LIMIT $6 FOR UPDATE SKIP LOCKED
)
SELECT *, pg_snapshot_xmin(pg_current_snapshot())::text::bigint, pg_snapshot_xmax(pg_current_snapshot())::text::bigint
FROM (SELECT * FROM a_k UNION ALL SELECT * FROM a_u UNION ALL SELECT * FROM n_u UNION ALL SELECT * FROM n_k) c`,
		tbl, cols, claimable("amqp"), claimable("nats"),
		heads("amqp", "$1::boolean", ""), heads("nats", "$2::boolean", bound("a_k", "$6")),
		bound("a_u", "$3 - (SELECT count(*) FROM a_k)"), natsFree)
}

// owed is the condition of a row still owed to target p (not delivered, not
// parked, not done): the predicate of the target's pending indexes.
func owed(p string) string {
	return fmt.Sprintf(`%[1]s_delivered_at IS NULL AND %[1]s_parked_at IS NULL AND done_at IS NULL`, p)
}

// keyWindow times the batch size is how many of the oldest keyed rows owed
// to a target a claim looks at for keys it may advance.
const keyWindow = 4

// claimed is one claimed row and what to do with it.
type claimed struct {
	msg      Message
	want     perTarget[bool]
	attempts perTarget[int32]
	// delivered: the target had the row before this batch.
	delivered perTarget[bool]
	badRow    string // why the row can never be published (bad headers), or ""
}

// claim claims a batch of up to limit rows per target, at most half of
// them keyed: so that unkeyed rows always get half a batch, and the keys in
// flight spread over at least two workers — with few keys, one batch could
// otherwise hold every key while the other workers find nothing to do.
//
// floor > 0 starts the unkeyed walks past that id (see Relay.claimFloor);
// held are keyed rows this relay's batches in flight hold, not tried.
// snapshot is the claim statement's snapshot: the oldest transaction still
// running, and the first transaction id not yet assigned (zero when the
// claim returned no rows).
type snapshot struct{ xmin, xmax int64 }

// batchSender is a connection that pipelines statements.
type batchSender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// claim begins a batch's transaction (batchBegin) and claims, in one round
// trip.
func (s *store) claim(ctx context.Context, db batchSender, active phase, limit int, skipParked bool, floor int64, held []int64) ([]*claimed, snapshot, error) {
	var snap snapshot
	b := &pgx.Batch{}
	for _, q := range batchBegin {
		b.Queue(q)
	}
	b.Queue(s.claimSQL, active.AMQP, active.NATS, limit, skipParked, keyWindow*limit, max(1, limit/2), floor, held)
	br := db.SendBatch(ctx, b)
	defer br.Close()
	for range batchBegin {
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
		if err := rows.Scan(&c.msg.ID, &c.msg.MessageID, &c.msg.Topic, &key, &headers, &c.msg.Payload,
			&c.msg.CreatedAt, &c.attempts.AMQP, &c.attempts.NATS, &c.delivered.AMQP, &c.delivered.NATS,
			&c.want.AMQP, &c.want.NATS, &snap.xmin, &snap.xmax); err != nil {
			return nil, snap, fmt.Errorf("claim batch: scan: %w", err)
		}
		if key != nil {
			c.msg.Key, c.msg.HasKey = *key, true
		}
		if headers != nil {
			c.msg.Headers, c.badRow = decodeHeaders(*headers)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, snap, fmt.Errorf("claim batch: %w", err)
	}
	rows.Close()
	// The walks come back one after the other, each in id order; the batch
	// is published in id order. Sorted here, not by the statement: an
	// ORDER BY over the walks' rows, payloads and all, was a third of the
	// claim's time in Postgres (EXPLAIN ANALYZE of 500 unkeyed rows: 1.25
	// ms with it, 0.85 ms without).
	slices.SortFunc(out, func(a, b *claimed) int { return cmp.Compare(a.msg.ID, b.msg.ID) })
	if err := br.Close(); err != nil {
		return nil, snap, fmt.Errorf("claim batch: %w", err)
	}
	return out, snap, nil
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

// Outcomes of one target for one row, as recordSQL expects them.
const (
	outcomeNone      = 0
	outcomeDelivered = 1
	outcomeRetry     = 2
	outcomeParked    = 3
	outcomeOutage    = 4
)

// batchRecord collects a batch's outcomes column-wise for recordSQL: rows
// still owed to an enabled target, and rows every enabled target now has.
type batchRecord struct {
	enabled phase // the targets a row must reach to be done

	ids     []int64
	outcome perTarget[[]int16]
	errText perTarget[[]string]
	backoff perTarget[[]int64] // milliseconds

	doneIDs []int64
	doneNow perTarget[[]bool] // delivered in this batch (else before)
}

func newBatchRecord(n int, enabled phase) *batchRecord {
	return &batchRecord{enabled: enabled, ids: make([]int64, 0, n), doneIDs: make([]int64, 0, n)}
}

// add records one claimed row's outcomes.
func (b *batchRecord) add(c *claimed, outcome perTarget[int16], errText perTarget[string], backoff perTarget[time.Duration]) {
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
	for _, t := range Targets {
		appendTo(&b.outcome, t, outcome.Get(t))
		appendTo(&b.errText, t, errText.Get(t))
		appendTo(&b.backoff, t, backoff.Get(t).Milliseconds())
	}
}

// args are recordSQL's parameters for b.
func (b *batchRecord) args() []any {
	return []any{b.ids,
		b.outcome.AMQP, b.errText.AMQP, b.backoff.AMQP,
		b.outcome.NATS, b.errText.NATS, b.backoff.NATS,
		b.doneIDs, b.doneNow.AMQP, b.doneNow.NATS}
}

// recordLate records that target t has the rows of msgIDs (their confirms
// came after their batches gave up), in a transaction of its own: rows every
// enabled target now has leave the outbox as a batch's do. It returns how
// many rows it marked.
//
// It waits for a row's lock at most lockWait: a batch in flight holds its
// rows for up to its publish timeout and its record.
func (s *store) recordLate(ctx context.Context, pool *pgxpool.Pool, t Target, msgIDs []string, enabled phase, lockWait time.Duration) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = '%dms'", lockWait.Milliseconds())); err != nil {
		return 0, err
	}
	rows, err := tx.Query(ctx, s.lateSQL.Get(t), msgIDs)
	if err != nil {
		return 0, err
	}
	done := newBatchRecord(0, enabled)
	marked := 0
	for rows.Next() {
		var id int64
		var has perTarget[bool]
		if err := rows.Scan(&id, &has.AMQP, &has.NATS); err != nil {
			rows.Close()
			return 0, err
		}
		marked++
		if (has.AMQP || !enabled.AMQP) && (has.NATS || !enabled.NATS) {
			done.doneIDs = append(done.doneIDs, id)
			done.doneNow.AMQP = append(done.doneNow.AMQP, false)
			done.doneNow.NATS = append(done.doneNow.NATS, false)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	if len(done.doneIDs) > 0 {
		if _, err := tx.Exec(ctx, s.recordSQL, done.args()...); err != nil {
			return 0, err
		}
	}
	return marked, tx.Commit(ctx)
}

// record writes a batch's outcomes and commits its transaction, in one
// round trip.
func (s *store) record(ctx context.Context, db batchSender, b *batchRecord) error {
	q := &pgx.Batch{}
	q.Queue(s.recordSQL, b.args()...)
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
