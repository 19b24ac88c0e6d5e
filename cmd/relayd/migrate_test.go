package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/relayd/relayd/internal/testenv"
)

// down-to 12 gives a relayd of the release before the owed table its one
// table back, with every row: those still in the outbox owed to every
// target, those of the owed table with their state; up then migrates again.
func TestMigrateDownToTheReleaseBefore(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	env := map[string]string{"RELAY_DATABASE_URL": testenv.DatabaseURL(t), "RELAY_OUTBOX_TABLE": table.String()}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('t.fresh', 'a'), ('t.owed', 'b')`); err != nil {
		t.Fatal(err)
	}
	testenv.SetState(t, pool, table, `nats_delivered_at = now(), amqp_attempts = 2, amqp_last_error = 'x'`, `topic = 't.owed'`)

	code, out, errOut := runCLI(t, env, "migrate", "--json", "down-to", "12")
	var down struct {
		Table  string  `json:"table"`
		Undone []int64 `json:"undone"`
	}
	ups, err := filepath.Glob("../../schema/migrations/*.up.sql")
	if err != nil {
		t.Fatal(err)
	}
	var want []int64 // every migration after 12, the latest first
	for v := int64(len(ups)); v > 12; v-- {
		want = append(want, v)
	}
	if err := json.Unmarshal([]byte(out), &down); code != exitOK || err != nil || !slices.Equal(down.Undone, want) {
		t.Fatalf("migrate down-to 12: exit %d, %v, %+v\n%s", code, err, down, errOut)
	}
	var owed *string
	if err := pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, table.Owed()).Scan(&owed); err != nil || owed != nil {
		t.Fatalf("the owed table after down-to 12: %v, %v", owed, err)
	}
	rows, err := pool.Query(ctx, `SELECT topic, nats_delivered_at IS NOT NULL, amqp_attempts, coalesce(amqp_last_error, '') FROM `+table.Ident()+` ORDER BY topic`)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		topic   string
		nats    bool
		tries   int
		lastErr string
	}
	var got []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.topic, &r.nats, &r.tries, &r.lastErr); err != nil {
			t.Fatal(err)
		}
		got = append(got, r)
	}
	if want := []row{{"t.fresh", false, 0, ""}, {"t.owed", true, 2, "x"}}; rows.Err() != nil || !slices.Equal(got, want) {
		t.Fatalf("rows after down-to 12: %+v (%v), want %+v", got, rows.Err(), want)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('t.after', 'c')`); err != nil {
		t.Fatalf("a producer's insert after down-to 12: %v", err)
	}

	if out := mustRun(t, env, "migrate"); out != fmt.Sprintf("%s: %d migration(s) applied\n", table, len(want)) {
		t.Fatalf("migrate up again: %q", out)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table.Owed()).Scan(&n); err != nil || n != 3 {
		t.Fatalf("rows in the owed table after up again: %d, %v; want 3", n, err)
	}
}
