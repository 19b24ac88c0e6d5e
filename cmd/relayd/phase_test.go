package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

// phaseSetup is an outbox of the test's own and the environment that
// points relayd at it.
func phaseSetup(t *testing.T) (env map[string]string, table schema.Table, history func() []phase.Change) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	pool := testenv.Pool(t)
	table = testenv.Outbox(t, pool)
	env = map[string]string{"RELAY_DATABASE_URL": testenv.DatabaseURL(t), "RELAY_OUTBOX_TABLE": table.String()}
	history = func() []phase.Change {
		t.Helper()
		h, err := phase.History(context.Background(), pool, table)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	return env, table, history
}

// phaseDoc is phase --json.
type phaseDoc struct {
	Table string `json:"table"`
	Phase *struct {
		Phase     phase.Name `json:"phase"`
		Step      int        `json:"step"`
		ChangedBy string     `json:"changed_by"`
		Reason    string     `json:"reason"`
		ChangedAt time.Time  `json:"changed_at"`
	} `json:"phase"`
	Relays []struct {
		Instance string     `json:"instance"`
		Phase    phase.Name `json:"phase"`
		Pinned   bool       `json:"pinned"`
		Seen     *float64   `json:"seen_ago_seconds"`
		Differs  bool       `json:"differs"`
	} `json:"relays"`
	History []phase.Change `json:"history"`
}

func mustRun(t *testing.T, env map[string]string, args ...string) string {
	t.Helper()
	code, out, errOut := runCLI(t, env, args...)
	if code != exitOK {
		t.Fatalf("relayd %v: exit %d\n%s\n%s", args, code, out, errOut)
	}
	return out
}

func showJSON(t *testing.T, env map[string]string, args ...string) phaseDoc {
	t.Helper()
	var doc phaseDoc
	out := mustRun(t, env, append([]string{"phase", "--json"}, args...)...)
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("phase --json: %v\n%s", err, out)
	}
	return doc
}

// phase shows the table's phase (or that none is set), who set it and why,
// the running relays with those apart from the table flagged, and with
// --history every change; --json says the same.
func TestPhaseShow(t *testing.T) {
	t.Parallel()
	env, table, _ := phaseSetup(t)
	ctx := context.Background()
	pool := testenv.Pool(t)

	for _, args := range [][]string{{"phase"}, {"phase", "show"}} {
		if out := mustRun(t, env, args...); !strings.Contains(out, "phase  "+phaseNotSet) || !strings.Contains(out, "no relay reports its phase") {
			t.Errorf("relayd %v, nothing set, no relay: want %q and no relay:\n%s", args, phaseNotSet, out)
		}
	}
	if doc := showJSON(t, env); doc.Table != table.String() || doc.Phase != nil || doc.Relays == nil || len(doc.Relays) != 0 {
		t.Errorf("phase --json, nothing set: %+v; want phase null and relays []", doc)
	}

	mustRun(t, env, "phase", "set", "dual", "--reason", "start dual write", "--by", "alice@h1")
	for _, in := range []phase.Instance{
		{Instance: "h1:10", Phase: phase.Dual, Version: "v2", StartedAt: time.Now()},
		{Instance: "h2:20", Phase: phase.AMQP, Pinned: true, Version: "v2", StartedAt: time.Now()},
	} {
		if err := phase.Beat(ctx, pool, table, in); err != nil {
			t.Fatal(err)
		}
	}
	out := mustRun(t, env, "phase")
	for _, want := range []string{"phase  dual (runbook step 1, dual write)", "by alice@h1: start dual write", "h1:10", "not the table's phase (dual)", "1 of 2 relays do not run the table's phase"} {
		if !strings.Contains(out, want) {
			t.Errorf("phase: want %q in:\n%s", want, out)
		}
	}
	for line := range strings.Lines(out) {
		if strings.HasPrefix(line, "h1:10") && strings.Contains(line, "not the table's") {
			t.Errorf("h1:10 runs the table's phase, but is flagged: %q", line)
		}
		if strings.HasPrefix(line, "h2:20") && (!strings.Contains(line, "amqp") || !strings.Contains(line, "yes") || !strings.Contains(line, "not the table's")) {
			t.Errorf("h2:20: %q, want amqp, pinned, flagged", line)
		}
	}
	doc := showJSON(t, env)
	if doc.Phase == nil || doc.Phase.Phase != phase.Dual || doc.Phase.Step != 1 || doc.Phase.ChangedBy != "alice@h1" || doc.Phase.Reason != "start dual write" || doc.Phase.ChangedAt.IsZero() {
		t.Errorf("phase --json: %+v", doc.Phase)
	}
	if len(doc.Relays) != 2 || doc.Relays[0].Differs || !doc.Relays[1].Differs || !doc.Relays[1].Pinned || doc.Relays[1].Seen == nil || doc.History != nil {
		t.Errorf("phase --json relays: %+v (history %v); want h2:20 pinned and differing, no history", doc.Relays, doc.History)
	}

	mustRun(t, env, "phase", "set", "nats", "--force", "--by", "bob@h2", "--reason", "cut over")
	out = mustRun(t, env, "phase", "--history")
	i := strings.Index(out, "history (oldest first)")
	if i < 0 {
		t.Fatalf("phase --history: no history:\n%s", out)
	}
	var rows []string
	for line := range strings.Lines(out[i:]) {
		if strings.Contains(line, "@h") {
			rows = append(rows, strings.Join(strings.Fields(line)[1:], " "))
		}
	}
	if want := []string{"dual alice@h1 - start dual write", "nats bob@h2 forced cut over"}; strings.Join(rows, "|") != strings.Join(want, "|") {
		t.Errorf("phase --history rows %q, want %q:\n%s", rows, want, out)
	}
	if doc := showJSON(t, env, "--history"); len(doc.History) != 2 || !doc.History[1].Forced || doc.History[0].Forced {
		t.Errorf("phase --json --history: %+v", doc.History)
	}
}

// phase set records the change with its reason and author (user@host by
// default); the phase it already has is recorded nowhere.
func TestPhaseSetRecords(t *testing.T) {
	t.Parallel()
	env, _, history := phaseSetup(t)

	out := mustRun(t, env, "phase", "set", "amqp", "--reason", "producers on the outbox")
	if !strings.Contains(out, "phase not set -> amqp (runbook step 0, legacy only)") {
		t.Errorf("phase set amqp: %s", out)
	}
	out = mustRun(t, env, "phase", "set", "--by", "carol@ops", "amqp,nats") // a RELAY_TARGETS value, after the flags
	if !strings.Contains(out, "phase amqp -> dual") || !strings.Contains(out, "by carol@ops") {
		t.Errorf("phase set amqp,nats: %s", out)
	}
	code, out, errOut := runCLI(t, env, "phase", "set", "dual", "--reason", "again")
	if code != exitOK || strings.TrimSpace(out) != "already dual: nothing recorded" || errOut != "" {
		t.Errorf("phase set dual while dual: exit %d, %q, %q; want 0 and already dual", code, out, errOut)
	}
	h := history()
	if len(h) != 2 {
		t.Fatalf("history: %+v, want 2 changes (the same phase recorded nothing)", h)
	}
	if h[0].Phase != phase.AMQP || h[0].Reason != "producers on the outbox" || !strings.Contains(h[0].ChangedBy, "@") || h[0].ChangedBy == "carol@ops" {
		t.Errorf("first change: %+v, want amqp by user@host with its reason", h[0])
	}
	if h[1].Phase != phase.Dual || h[1].ChangedBy != "carol@ops" || h[1].Forced {
		t.Errorf("second change: %+v, want dual by carol@ops, not forced", h[1])
	}
}

// A change made between phase set's read and its record fails it: nothing
// of its own is recorded.
func TestPhaseSetConflict(t *testing.T) {
	t.Parallel()
	env, table, history := phaseSetup(t)
	pool := testenv.Pool(t)
	mustRun(t, env, "phase", "set", "dual", "--by", "a@h")
	read, _, err := phase.Read(context.Background(), pool, table)
	if err != nil {
		t.Fatal(err)
	}
	// Another change, after phase set read the phase and before it records.
	if _, err := phase.Set(context.Background(), pool, table, phase.Change{Phase: phase.AMQP, ChangedBy: "other@h"}, read, true); err != nil {
		t.Fatal(err)
	}
	var errBuf, outBuf strings.Builder
	c := &cli{stdout: &outBuf, stderr: &errBuf, env: envconfig.MapLookuper(env)}
	ss, err := openSession(context.Background(), c, sessionOptions{Conns: readerConns})
	if ss == nil {
		t.Fatalf("session: exit %d: %s", c.exitCode(err), errBuf.String())
	}
	defer ss.close()
	code := c.exitCode((&phaseSetCommand{cli: c, phaseSetArgs: phaseSetArgs{to: phase.NATS, force: true, by: "b@h"}}).record(ss, read, true))
	out, errOut := outBuf.String(), errBuf.String()
	if code != exitFailure || !strings.Contains(errOut, "not recorded: ") || !strings.Contains(errOut, "it is amqp now") || strings.Contains(out, "recorded at") {
		t.Errorf("phase set with a change meanwhile: exit %d, %q, %q; want 1 saying it is amqp now", code, out, errOut)
	}
	h := history()
	if len(h) != 2 || h[1].ChangedBy != "other@h" {
		t.Errorf("history %+v: want dual then other@h's amqp, nothing of b@h", h)
	}
}

// Leaving nats says the rows of phase 4 went to JetStream only, since when
// (from the history), and the relayd replay that sends them to RabbitMQ.
func TestPhaseSetRollbackFromNATS(t *testing.T) {
	t.Parallel()
	env, _, history := phaseSetup(t)
	mustRun(t, env, "phase", "set", "dual")
	out := mustRun(t, env, "phase", "set", "nats", "--force", "--reason", "rolling upgrade")
	if !strings.Contains(out, "forced: the cutover check was not run") {
		t.Errorf("phase set nats --force: want what was skipped:\n%s", out)
	}
	if strings.Contains(out, "relayd replay") {
		t.Errorf("moving to nats: no rollback guidance wanted:\n%s", out)
	}
	for _, to := range []string{"dual", "amqp"} {
		h := history()
		start := h[len(h)-1].ChangedAt.UTC().Format(time.RFC3339)
		if to == "amqp" {
			mustRun(t, env, "phase", "set", "nats", "--force")
			h = history()
			start = h[len(h)-1].ChangedAt.UTC().Format(time.RFC3339)
		}
		out := mustRun(t, env, "phase", "set", to)
		for _, want := range []string{"since phase 4 began (" + start + ")", "went to JetStream only", "relayd replay --dry-run", "relayd replay\n"} {
			if !strings.Contains(out, want) {
				t.Errorf("nats -> %s: want %q in:\n%s", to, want, out)
			}
		}
	}
	if h := history(); len(h) != 5 || !h[1].Forced || h[2].Forced || !h[3].Forced {
		t.Errorf("history %+v: want the moves to nats forced, the others not", h)
	}
	// Leaving a phase other than nats says nothing of replay.
	if out := mustRun(t, env, "phase", "set", "dual"); strings.Contains(out, "replay") {
		t.Errorf("amqp -> dual: no rollback guidance wanted:\n%s", out)
	}
}

// A bad argument or flag exits 2 with one line naming it, before anything
// is connected (base's database does not exist).
func TestPhaseUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"phase", "set", "bogus"}, `argument "bogus": want amqp, dual or nats`},
		{[]string{"phase", "set"}, "want the phase: amqp, dual or nats"},
		{[]string{"phase", "set", "--reason", "x"}, "want the phase"},
		{[]string{"phase", "frobnicate"}, `unknown action "frobnicate"`},
		{[]string{"phase", "show", "extra"}, `unexpected argument "extra"`},
		{[]string{"phase", "set", "dual", "extra"}, `unexpected argument "extra"`},
		{[]string{"phase", "set", "dual", "--reason", "x", "extra"}, `unexpected argument "extra"`},
		{[]string{"phase", "--bogus"}, "not defined: --bogus"},
		{[]string{"phase", "set", "dual", "--bogus"}, "not defined: --bogus"},
		{[]string{"phase", "set", "nats"}, "name the consumer groups"},
		{[]string{"phase", "set", "dual", "--consumer", "c"}, "--consumer is for the cutover check"},
		{[]string{"phase", "set", "nats", "--force", "--queue", "q"}, "--queue is for the cutover check"},
		{[]string{"phase", "set", "nats", "--consumer", "c", "--quiet-period", "-1s"}, "--quiet-period and --timeout must be positive"},
		{[]string{"phase", "set", "dual", "--connect-timeout", "0s"}, "--connect-timeout must be a positive duration"},
		{[]string{"phase", "--connect-timeout", "0s"}, "--connect-timeout must be a positive duration"},
	} {
		code, out, errOut := runCLI(t, base(), tc.args...)
		if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("relayd %v: exit %d, stdout %q, stderr %q; want 2 and one line with %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// A commit whose answer Postgres never gives (its session ended during the
// commit, as in a failover) leaves the change unknown: phase set says it may
// be recorded and where to look, not just that it failed.
func TestPhaseSetCommitAnswerLost(t *testing.T) {
	t.Parallel()
	env, table, _ := phaseSetup(t)
	pool := testenv.Pool(t)
	ctx := context.Background()
	mustRun(t, env, "phase", "set", "dual")
	// A deferred trigger holds the commit of a change until the test ends
	// that session.
	app := "relayd-test-commit-" + table.Schema
	fn := table.Schema + ".hold_commit"
	if _, err := pool.Exec(ctx, `CREATE FUNCTION `+fn+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN PERFORM set_config('application_name', '`+app+`', false); PERFORM pg_sleep(60); RETURN NULL; END $$`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE CONSTRAINT TRIGGER hold_commit AFTER INSERT OR UPDATE ON `+table.Side("phase")+`
		DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION `+fn+`()`); err != nil {
		t.Fatal(err)
	}
	type result struct {
		code        int
		out, errOut string
	}
	done := make(chan result, 1)
	go func() {
		code, out, errOut := runCLI(t, env, "phase", "set", "amqp", "--by", "b@h")
		done <- result{code, out, errOut}
	}()
	testenv.Eventually(t, 30*time.Second, func() bool {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n)
		return err == nil && n > 0
	}, "the change's commit never reached the trigger")
	var r result
	select {
	case r = <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("phase set did not return after its session ended")
	}
	if r.code != exitFailure || !strings.Contains(r.errOut, "may or may not be recorded") || !strings.Contains(r.errOut, "relayd phase") {
		t.Errorf("phase set whose commit's answer was lost: exit %d, %q, %q; want 1 saying it may be recorded and to look with relayd phase", r.code, r.out, r.errOut)
	}
}
