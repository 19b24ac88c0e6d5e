package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
)

// batchIDs is the index condition of a record's scan that reads only the
// batch's rows: by the id of the unnested outcomes.
var batchIDs = regexp.MustCompile(`\(id = [ud](_\d+)?\.id\)`)

// planScans explains stmt (an EXECUTE) on tx and returns, for each scan of
// the tables named rels, its node type and index condition (a bitmap scan's
// recheck condition).
func planScans(t *testing.T, tx pgx.Tx, stmt string, rels ...string) (scans []string) {
	t.Helper()
	var doc []struct{ Plan map[string]any }
	var raw string
	if err := tx.QueryRow(context.Background(), "EXPLAIN (FORMAT JSON) "+stmt).Scan(&raw); err != nil {
		t.Fatalf("explain %s: %v", stmt, err)
	}
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		if rel, _ := n["Relation Name"].(string); slices.Contains(rels, rel) && n["Node Type"] != "ModifyTable" {
			cond, _ := n["Index Cond"].(string)
			if recheck, ok := n["Recheck Cond"].(string); ok { // bitmap heap scan
				cond = recheck
			}
			scans = append(scans, fmt.Sprintf("%v [%s]", n["Node Type"], cond))
		}
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			walk(k.(map[string]any))
		}
	}
	walk(doc[0].Plan)
	return scans
}

// prepared is PREPARE name AS the statement sql, its parameters typed by the
// fields of p, its params struct, and EXECUTE name with p's values; pos is
// the $n of each parameter by name, as pgx numbers them.
func prepared(name, sql string, p any) (prepare, execute string, pos map[string]int) {
	positional, names := outboxsql.Positional(sql)
	v := reflect.ValueOf(p)
	fields := map[string]reflect.Value{}
	for i := range v.NumField() {
		fields[v.Type().Field(i).Tag.Get("db")] = v.Field(i)
	}
	types, values, pos := make([]string, len(names)), make([]string, len(names)), map[string]int{}
	for i, n := range names {
		f, ok := fields[n]
		if !ok {
			panic(fmt.Sprintf("%T has no field for @%s", p, n))
		}
		types[i], values[i], pos[n] = pgType(f.Type()), pgLiteral(f), i+1
	}
	return "PREPARE " + name + "(" + strings.Join(types, ", ") + ") AS " + positional,
		"EXECUTE " + name + "(" + strings.Join(values, ", ") + ")", pos
}

// pgType is the Postgres type pgx sends a params struct's field of type t as.
func pgType(t reflect.Type) string {
	switch {
	case t == reflect.TypeFor[time.Time]():
		return "timestamptz"
	case t.Kind() == reflect.Bool:
		return "boolean"
	case t.Kind() == reflect.Int16:
		return "smallint"
	case t.Kind() == reflect.Int || t.Kind() == reflect.Int32:
		return "int"
	case t.Kind() == reflect.Int64:
		return "bigint"
	case t.Kind() == reflect.String:
		return "text"
	case t.Kind() == reflect.Slice:
		return pgType(t.Elem()) + "[]"
	case t.Kind() == reflect.Pointer:
		return pgType(t.Elem())
	}
	panic("no Postgres type for " + t.String())
}

// pgLiteral is v as an SQL literal; pgArrayElem an element of an array's.
func pgLiteral(v reflect.Value) string {
	switch v.Kind() {
	case reflect.Slice:
		elems := make([]string, v.Len())
		for i := range elems {
			elems[i] = pgArrayElem(v.Index(i))
		}
		return "'{" + strings.ReplaceAll(strings.Join(elems, ","), "'", "''") + "}'"
	case reflect.String:
		return "'" + strings.ReplaceAll(v.String(), "'", "''") + "'"
	case reflect.Pointer:
		if v.IsNil() {
			return "NULL"
		}
		return pgLiteral(v.Elem())
	}
	return fmt.Sprint(v.Interface())
}

func pgArrayElem(v reflect.Value) string {
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			return "NULL"
		}
		return pgArrayElem(v.Elem())
	case reflect.String:
		return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(v.String()) + `"`
	}
	return fmt.Sprint(v.Interface())
}

// claimParams are the claim's parameters in these tests: both targets, a
// batch of 500, the first claim's floors; held the rows held.
func claimParams(held []int64) outboxsql.ClaimParams {
	return outboxsql.ClaimParams{AMQPActive: true, NATSActive: true, AMQPEnabled: true, NATSEnabled: true, BatchSize: 500, KeyedWindow: 2000, KeyedRows: 250,
		HeldIDs: held, FreshTo: math.MaxInt64}
}

// beginClaim begins a transaction as a batch does (outboxsql.BatchBegin's
// settings) with the claim prepared as c; the caller rolls it back, and
// executes c with exec(p).
func beginClaim(t *testing.T, f *fixture) (tx pgx.Tx, exec func(p outboxsql.ClaimParams) string) {
	t.Helper()
	ctx := context.Background()
	tx, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	claimSQL := newStore(f.table).sql.Claim
	prepare, _, _ := prepared("c", claimSQL, outboxsql.ClaimParams{})
	exec = func(p outboxsql.ClaimParams) string {
		_, execute, _ := prepared("c", claimSQL, p)
		return execute
	}
	for _, q := range append(outboxsql.BatchBegin[1:], prepare) {
		if _, err := tx.Exec(ctx, q); err != nil {
			tx.Rollback(ctx) //nolint:errcheck // failing anyway
			t.Fatal(err)
		}
	}
	return tx, exec
}

// explainPlan runs EXPLAIN (opts, FORMAT JSON) stmt on tx and calls visit on
// every node of the plan, parents before children.
func explainPlan(t *testing.T, tx pgx.Tx, opts, stmt string, visit func(n map[string]any)) (root map[string]any) {
	t.Helper()
	var raw string
	if err := tx.QueryRow(context.Background(), "EXPLAIN ("+opts+"FORMAT JSON) "+stmt).Scan(&raw); err != nil {
		t.Fatalf("explain %s: %v", stmt, err)
	}
	var doc []struct{ Plan map[string]any }
	if err := json.Unmarshal([]byte(raw), &doc); err != nil {
		t.Fatal(err)
	}
	var walk func(n map[string]any)
	walk = func(n map[string]any) {
		visit(n)
		kids, _ := n["Plans"].([]any)
		for _, k := range kids {
			walk(k.(map[string]any))
		}
	}
	walk(doc[0].Plan)
	return doc[0].Plan
}

// The batch's statements read the outbox through its indexes, and the
// record only the batch's rows, whatever the table's size when they were
// planned. A plan is made once per connection from statistics an outbox
// outgrows within seconds: the record planned on a small table joined the
// batch's ids to a sequential scan of the whole table and kept doing so as
// the table grew (45 ms a batch in the latency benchmark).
func TestBatchPlansStayOnIndexes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.noAutovacuum()
	st := newStore(f.table)
	str := func(s ...string) []*string {
		out := make([]*string, len(s))
		for i := range s {
			out[i] = &s[i]
		}
		return out
	}
	prepareClaim, claim, claimPos := prepared("c", st.sql.Claim, claimParams([]int64{7, 8}))
	prepareRecord, record, _ := prepared("r", st.sql.Record, outboxsql.RecordParams{
		IDs:          []int64{1, 2},
		AMQPOutcomes: []outboxsql.Outcome{1, 2}, AMQPErrors: []string{"x", "y"}, AMQPBackoffsMS: []int64{0, 0},
		NATSOutcomes: []outboxsql.Outcome{1, 2}, NATSErrors: []string{"x", "y"}, NATSBackoffsMS: []int64{0, 0},
		DoneIDs: []int64{3, 4}, AMQPDoneNow: []bool{true, true}, NATSDoneNow: []bool{true, true},
		RouteExchanges: str("x", "y"), RouteRoutingKeys: str("k", "k"), RouteSubjects: str("s.a", "s.b"), RouteStreams: str("S", "S"),
	})
	plans := func(opts pgx.TxOptions) (claimScans, recordScans []string) {
		t.Helper()
		tx, err := f.pool.BeginTx(ctx, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer func() {
			// Prepared statements outlive the transaction: drop them.
			tx.Exec(ctx, `DEALLOCATE c; DEALLOCATE r`) //nolint:errcheck // rolled back next
			tx.Rollback(ctx)                           //nolint:errcheck // nothing to keep
		}()
		for _, q := range []string{prepareClaim, prepareRecord} {
			if _, err := tx.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		return planScans(t, tx, claim, f.table.Name, f.table.Name+"_owed"), planScans(t, tx, record, f.table.Name, f.table.Name+"_owed")
	}
	seq := func(scans []string) bool { return strings.Contains(strings.Join(scans, " "), "Seq Scan") }

	f.fill(100)
	// The small table misleads a generic plan without the batch's settings...
	if _, rec := plans(pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan"}); !seq(rec) {
		t.Fatalf("record planned without sequential scans on a small table without outboxsql.BatchBegin's settings (%v): the test does not reproduce the hazard", rec)
	}
	// ...not with them, on a small table or a large one.
	for _, size := range []string{"small", "large"} {
		if size == "large" {
			f.fill(20_000)
		}
		claimScans, recordScans := plans(pgx.TxOptions{BeginQuery: strings.Join(outboxsql.BatchBegin, "; ")})
		if seq(claimScans) {
			t.Errorf("%s table: claim plans a sequential scan of the outbox: %v", size, claimScans)
		}
		// The outbox's unkeyed walk reads no keyed row: its index condition says so.
		unkeyed := fmt.Sprintf("[((key IS NULL) AND (id > $%d) AND (id <= $%d))]", claimPos["fresh_from"], claimPos["fresh_to"])
		if !slices.ContainsFunc(claimScans, func(s string) bool { return strings.Contains(s, unkeyed) }) {
			t.Errorf("%s table: no walk of the outbox's unkeyed rows by key_order: %v", size, claimScans)
		}
		for _, s := range recordScans {
			if !batchIDs.MatchString(s) {
				t.Errorf("%s table: record reads the outbox beyond the batch's ids: %v", size, recordScans)
				break
			}
		}
		t.Logf("%s table: record scans %v", size, recordScans)
	}
}

// A sweep reads its walk's rows again for those it could not lock, through
// key_order's unkeyed rows as the walk does: the outbox's primary key would
// step over every keyed row in the range.
func TestASweepReadsTheRowsItCouldNotLockByKeyOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	p := claimParams(nil)
	p.FreshTo, p.Sweep = 9000, true
	prepare, execute, pos := prepared("c", newStore(f.table).sql.Claim, p)
	f.fill(20_000)
	tx, err := f.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: strings.Join(outboxsql.BatchBegin, "; ")})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	if _, err := tx.Exec(ctx, prepare); err != nil {
		t.Fatal(err)
	}
	scans := planScans(t, tx, execute, f.table.Name)
	held := fmt.Sprintf("[((key IS NULL) AND (id > $%d) AND (id <= CASE", pos["fresh_from"])
	if !slices.ContainsFunc(scans, func(s string) bool { return strings.HasPrefix(s, "Index Only Scan ") && strings.Contains(s, held) }) {
		t.Errorf("no index-only read of the sweep's unkeyed rows by key_order: %v", scans)
	}
}

// A keyed claim does not try to lock the rows this relay's other batches
// hold (@held_ids): with few keys most heads are in flight, and each claim tried
// every one of them before reaching a free key. Here 60 of 100 keys' first
// rows are locked by another transaction; the claim takes the 40 free heads
// either way, and with the 60 passed as held it tries to lock only those.
func TestKeyedClaimDoesNotTryHeldRows(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.noAutovacuum()
	f.insertKeyed(100, 5)
	other, err := f.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx) //nolint:errcheck // only held locks
	var held []int64
	if err := other.QueryRow(ctx, `SELECT array_agg(id) FROM (SELECT id FROM `+f.table.Ident()+` WHERE id IN (
		SELECT min(id) FROM `+f.table.Ident()+` GROUP BY key ORDER BY 1 LIMIT 60) FOR UPDATE) l`).Scan(&held); err != nil {
		t.Fatal(err)
	}
	// tried is how many rows the claim tried to lock, and claimed how many
	// it returned.
	claim := func(held []int64) (tried, claimed float64) {
		t.Helper()
		tx, exec := beginClaim(t, f)
		defer tx.Rollback(ctx)             //nolint:errcheck // EXPLAIN ANALYZE locked rows: let them go
		defer tx.Exec(ctx, `DEALLOCATE c`) //nolint:errcheck // rolled back next
		root := explainPlan(t, tx, "ANALYZE, ", exec(claimParams(held)), func(n map[string]any) {
			if n["Node Type"] != "LockRows" {
				return
			}
			kids, _ := n["Plans"].([]any)
			for _, k := range kids {
				if k := k.(map[string]any); k["Parent Relationship"] == "Outer" {
					tried += k["Actual Rows"].(float64) * k["Actual Loops"].(float64)
				}
			}
		})
		return tried, root["Actual Rows"].(float64) - 1 // the first row is the snapshot
	}
	if tried, claimed := claim(nil); claimed != 40 || tried != 100 {
		t.Fatalf("without held rows: claimed %v, tried to lock %v; want 40 of 100 (the test does not set up what it means to)", claimed, tried)
	}
	if tried, claimed := claim(held); claimed != 40 || tried != 40 {
		t.Fatalf("with the 60 locked heads held: claimed %v, tried to lock %v; want 40 of 40", claimed, tried)
	}
}

// A claim's rows come back in id order, whichever walk took them: keyed
// rows for RabbitMQ, unkeyed ones, and rows only JetStream still wants. The
// walks return one after the other (keyed first), and the statement does
// not sort them: claim does.
func TestClaimReturnsRowsInIDOrder(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	tbl := f.table.Ident()
	// ids 1–3: RabbitMQ has them (nats_unkeyed); 4–6 unkeyed (fresh_unkeyed); 7–9 keyed (fresh_keyed).
	for _, q := range []string{
		`INSERT INTO ` + tbl + ` (topic, payload) SELECT 't', '\x00' FROM generate_series(1, 6)`,
		`INSERT INTO ` + tbl + ` (topic, payload, key) SELECT 't', '\x00', 'k' || g FROM generate_series(1, 3) g`,
	} {
		if _, err := f.pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	testenv.SetState(t, f.pool, f.table, `amqp_delivered_at = now()`, `id IN (SELECT id FROM `+tbl+` ORDER BY id LIMIT 3)`)
	conn, err := f.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	defer conn.Exec(ctx, `ROLLBACK`) //nolint:errcheck // nothing to keep

	rows, _, err := newStore(f.table).claim(ctx, conn, dualWrite, dualWrite, 500, false, floors{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []int64
	keyed, natsOnly := 0, 0
	for _, c := range rows {
		ids = append(ids, c.msg.ID)
		if c.msg.HasKey {
			keyed++
		}
		if !c.want.AMQP && c.want.NATS {
			natsOnly++
		}
	}
	if len(rows) != 9 || keyed != 3 || natsOnly != 3 {
		t.Fatalf("claimed %d rows (%d keyed, %d for JetStream only), want 9 (3, 3): the test does not cover every walk", len(rows), keyed, natsOnly)
	}
	if !slices.IsSorted(ids) {
		t.Errorf("claimed ids %v, want them in id order", ids)
	}
}

// A claim finds each key's first row in its window by hashing the window on
// the key, not by sorting it: DISTINCT ON (key) sorted up to 4 × the batch
// size rows by their text keys, a fifth of a keyed claim's time.
func TestKeyedHeadsAreNotSortedByKey(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	f.noAutovacuum()
	f.insertKeyed(100, 5)
	tx, exec := beginClaim(t, f)
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep
	var sorts []string
	hashed := 0
	explainPlan(t, tx, "", exec(claimParams([]int64{})), func(n map[string]any) {
		if keys, ok := n["Sort Key"].([]any); ok {
			sorts = append(sorts, fmt.Sprint(keys))
		}
		if n["Node Type"] == "Aggregate" && n["Strategy"] == "Hashed" {
			hashed++
		}
	})
	for _, s := range sorts {
		if strings.Contains(s, ".key") || strings.Contains(s, "[key") {
			t.Errorf("claim sorts by key: %v", sorts)
			break
		}
	}
	if hashed < 2 {
		t.Errorf("%d hashed aggregates in the claim's plan, want one per target's heads", hashed)
	}
}
