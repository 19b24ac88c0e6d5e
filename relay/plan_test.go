package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// planScans explains stmt (an EXECUTE) on tx and returns, for each scan of
// the table named rel, its node type and index condition (a bitmap scan's
// recheck condition).
func planScans(t *testing.T, tx pgx.Tx, stmt, rel string) (scans []string) {
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
		if n["Relation Name"] == rel && n["Node Type"] != "ModifyTable" {
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
	const (
		claim  = `EXECUTE c(true, true, 500, false, 2000, 250, 0)`
		record = `EXECUTE r('{1,2}', '{1,2}', '{x,y}', '{0,0}', '{1,2}', '{x,y}', '{0,0}', '{3,4}', '{t,t}', '{t,t}')`
	)
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
		for _, q := range []string{
			`PREPARE c(boolean, boolean, int, boolean, int, int, bigint) AS ` + st.claimSQL,
			`PREPARE r(bigint[], smallint[], text[], bigint[], smallint[], text[], bigint[], bigint[], boolean[], boolean[]) AS ` + st.recordSQL,
		} {
			if _, err := tx.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		return planScans(t, tx, claim, f.table.Name), planScans(t, tx, record, f.table.Name)
	}
	seq := func(scans []string) bool { return strings.Contains(strings.Join(scans, " "), "Seq Scan") }

	f.fill(100)
	// The small table misleads a generic plan without the batch's settings...
	if _, rec := plans(pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan"}); !seq(rec) {
		t.Fatalf("record planned without sequential scans on a small table without batchBegin's settings (%v): the test does not reproduce the hazard", rec)
	}
	// ...not with them, on a small table or a large one.
	for _, size := range []string{"small", "large"} {
		if size == "large" {
			f.fill(20_000)
		}
		claimScans, recordScans := plans(pgx.TxOptions{BeginQuery: strings.Join(batchBegin, "; ")})
		if seq(claimScans) {
			t.Errorf("%s table: claim plans a sequential scan of the outbox: %v", size, claimScans)
		}
		for _, s := range recordScans {
			if !strings.Contains(s, "(id = u.id)") && !strings.Contains(s, "(id = d.id)") {
				t.Errorf("%s table: record reads the outbox beyond the batch's ids: %v", size, recordScans)
				break
			}
		}
		t.Logf("%s table: record scans %v", size, recordScans)
	}
}
