package integration

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/testenv"
)

// `relayd migrate` creates the outbox table and, with --inbox, a consumer's
// inbox table; `status` lists what is applied; a second run applies nothing.
func TestMigrateCommand(t *testing.T) {
	t.Parallel()
	url := testenv.DatabaseURL(t)
	pool := testenv.Pool(t)
	sch := testenv.Name("m")
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP SCHEMA IF EXISTS "`+sch+`" CASCADE`) })
	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(relaydBin, append([]string{"migrate"}, args...)...)
		cmd.Env = []string{"RELAY_DATABASE_URL=" + url, "RELAY_OUTBOX_TABLE=" + sch + ".events"}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("relayd migrate %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	ups, err := filepath.Glob("../schema/migrations/*.up.sql")
	if err != nil || len(ups) == 0 {
		t.Fatalf("schema migrations: %v (%d)", err, len(ups))
	}
	if out := run(); !strings.Contains(out, fmt.Sprintf("%d migration(s) applied", len(ups))) {
		t.Fatalf("first migrate: %q", out)
	}
	if out := run("up"); !strings.Contains(out, "0 migration(s) applied") {
		t.Fatalf("second migrate: %q", out)
	}
	if out := run("status"); strings.Count(out, "applied") < 2 {
		t.Fatalf("status: %q", out)
	}
	run("--inbox", sch+".inbox")
	if out := run("--inbox", sch+".inbox", "status"); !strings.Contains(out, "applied") {
		t.Fatalf("inbox status: %q", out)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM information_schema.tables WHERE table_schema = $1 AND table_name IN ('events', 'events_owed', 'events_backfilled', 'inbox')`, sch).Scan(&n); err != nil || n != 4 {
		t.Fatalf("tables created: %d, %v; want events, events_owed, events_backfilled and inbox", n, err)
	}
}
