package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// status reports the targets the outbox has rows for — not the operator
// shell's RELAY_TARGETS, which need not be the relays' — or those --targets
// names; every target while nothing has been relayed.
func TestStatusTargets(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	env := map[string]string{"RELAY_DATABASE_URL": testenv.DatabaseURL(t), "RELAY_OUTBOX_TABLE": table.String(), "RELAY_TARGETS": "amqp"}
	status := func(args ...string) (targets []relay.Target, lagSeconds bool) {
		t.Helper()
		code, out, errOut := runCLI(t, env, append([]string{"status", "--json"}, args...)...)
		var doc struct {
			Targets []map[string]any `json:"targets"`
		}
		if err := json.Unmarshal([]byte(out), &doc); code != exitOK || err != nil {
			t.Fatalf("status %v: exit %d, %v\n%s\n%s", args, code, err, out, errOut)
		}
		lagSeconds = len(doc.Targets) > 0
		for _, s := range doc.Targets {
			targets = append(targets, relay.Target(s["target"].(string)))
			_, ok := s["lag_seconds"]
			lagSeconds = lagSeconds && ok
		}
		return targets, lagSeconds
	}
	ctx := context.Background()
	insert := func(deliveredTo string) {
		t.Helper()
		var id int64
		if err := pool.QueryRow(ctx, `INSERT INTO `+table.Ident()+` (topic, payload) VALUES ('orders', '\x7b7d') RETURNING id`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		if deliveredTo != "" {
			testenv.SetState(t, pool, table, deliveredTo+"_delivered_at = now()", "id = $1", id)
		}
	}

	insert("")
	if got, lag := status(); !slices.Equal(got, relay.Targets) || !lag {
		t.Errorf("nothing relayed yet: targets %v (lag_seconds %v), want every target with lag_seconds", got, lag)
	}
	insert("nats") // relays serve nats only, whatever this shell's RELAY_TARGETS says
	if got, _ := status(); !slices.Equal(got, []relay.Target{relay.TargetNATS}) {
		t.Errorf("rows delivered to nats only: targets %v, want [nats]", got)
	}
	if got, _ := status("--targets", "amqp,nats"); !slices.Equal(got, relay.Targets) {
		t.Errorf("--targets amqp,nats: targets %v", got)
	}
	if code, _, errOut := runCLI(t, env, "status", "--targets", "sqs"); code != exitUsage || !strings.Contains(errOut, "--targets") {
		t.Errorf("--targets sqs: exit %d, %q; want 2 naming --targets", code, errOut)
	}
}

// Every command that reports takes --json: migrate, outbox retry (and the
// others, tested with their commands).
func TestJSONReports(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	env := map[string]string{"RELAY_DATABASE_URL": testenv.DatabaseURL(t), "RELAY_OUTBOX_TABLE": table.String()}
	for _, tc := range []struct {
		args []string
		into any
	}{
		{[]string{"migrate", "--json"}, &struct {
			Table   string  `json:"table"`
			Applied []int64 `json:"applied"`
		}{}},
		{[]string{"migrate", "--json", "status"}, &[]migrationJSON{}},
		{[]string{"outbox", "retry", "--all", "--json"}, &struct {
			Retried *int64 `json:"retried"`
		}{}},
		{[]string{"outbox", "parked", "--json"}, &[]relay.ParkedRow{}},
	} {
		code, out, errOut := runCLI(t, env, tc.args...)
		dec := json.NewDecoder(strings.NewReader(out))
		dec.DisallowUnknownFields()
		if err := dec.Decode(tc.into); code != exitOK || err != nil {
			t.Errorf("relayd %v: exit %d, %v\n%s\n%s", tc.args, code, err, out, errOut)
		}
	}
}

// status also prints the table's phase and the running relays, each with
// its phase and whether it is pinned, in text and in --json.
func TestStatusPhaseAndRelays(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	env := map[string]string{"RELAY_DATABASE_URL": testenv.DatabaseURL(t), "RELAY_OUTBOX_TABLE": table.String()}
	if out := mustRun(t, env, "status"); !strings.Contains(out, "phase  "+phaseNotSet) || !strings.Contains(out, "no relay reports its phase") {
		t.Errorf("status, no phase, no relay:\n%s", out)
	}
	if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.Dual, ChangedBy: "a@h"}, phase.Change{}, false); err != nil {
		t.Fatal(err)
	}
	if err := phase.Beat(ctx, pool, table, phase.Instance{Instance: "h9:99", Phase: phase.NATS, Pinned: true, Version: "v3", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, env, "status")
	if !strings.Contains(out, "TARGET") || !strings.Contains(out, "phase  dual (runbook step 1, dual write)") {
		t.Errorf("status: want the targets and the phase:\n%s", out)
	}
	found := false
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 3 && f[0] == "h9:99" {
			found = f[1] == "nats" && f[2] == "yes" && strings.Contains(line, "not the table's phase")
		}
	}
	if !found {
		t.Errorf("status: want h9:99 in nats, pinned, flagged:\n%s", out)
	}
	var doc struct {
		Targets []relay.TargetStats `json:"targets"`
		Phase   *struct {
			Phase phase.Name `json:"phase"`
		} `json:"phase"`
		Relays []struct {
			Instance string     `json:"instance"`
			Phase    phase.Name `json:"phase"`
			Pinned   bool       `json:"pinned"`
			Differs  bool       `json:"differs"`
		} `json:"relays"`
	}
	if err := json.Unmarshal([]byte(mustRun(t, env, "status", "--json")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Targets) == 0 || doc.Phase == nil || doc.Phase.Phase != phase.Dual || len(doc.Relays) != 1 ||
		doc.Relays[0].Instance != "h9:99" || doc.Relays[0].Phase != phase.NATS || !doc.Relays[0].Pinned || !doc.Relays[0].Differs {
		t.Errorf("status --json: %+v", doc)
	}
}

// status names what holds back VACUUM's horizon, in a database of the
// test's own: a pg_dump-like snapshot left open, by its application name,
// pid and state; then relayd's tables' dead rows and size.
func TestStatusNamesWhatHoldsTheHorizon(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	url := testenv.Database(t)
	env := map[string]string{"RELAY_DATABASE_URL": url, "RELAY_OUTBOX_TABLE": "outbox"}
	mustRun(t, env, "migrate")
	dump := testenv.Session(t, url, "nightly-dump")
	if _, err := dump.Exec(ctx, `BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT count(*) FROM pg_class`); err != nil {
		t.Fatal(err)
	}
	out := mustRun(t, env, "status")
	want := regexp.MustCompile(fmt.Sprintf(`(?m)^horizon  held by a snapshot \(nightly-dump, pid %d, idle in transaction\) for \d+s, \d+ transaction ids back$`, dump.PgConn().PID()))
	if !want.MatchString(out) {
		t.Errorf("status does not name the snapshot (%s):\n%s", want, out)
	}
	if !regexp.MustCompile(`(?m)^tables   outbox 0 dead, 0 live, \d+ kB; owed 0 dead, 0 live, \d+ kB; delivered 0 dead, 0 live, \d+ kB$`).MatchString(out) {
		t.Errorf("status does not give the tables' figures:\n%s", out)
	}
}

// status --check fails on a target past either threshold, naming it.
func TestStatusCheckBreaches(t *testing.T) {
	th := statusCheck{maxLag: time.Minute, maxParked: 0}
	for _, tc := range []struct {
		stats []relay.TargetStats
		want  []string
	}{
		{nil, nil},
		{[]relay.TargetStats{{Target: relay.TargetAMQP, Lag: time.Minute}}, nil}, // at the threshold: fine
		{[]relay.TargetStats{{Target: relay.TargetNATS, Lag: 90 * time.Second}}, []string{"nats: lag 1m30s, over --max-lag 1m0s"}},
		{[]relay.TargetStats{{Target: relay.TargetAMQP, Parked: 2}, {Target: relay.TargetNATS, Lag: 2 * time.Minute, Parked: 1}},
			[]string{"amqp: 2 parked, over --max-parked 0", "nats: lag 2m0s, over --max-lag 1m0s", "nats: 1 parked, over --max-parked 0"}},
	} {
		if got := th.breaches(tc.stats); !slices.Equal(got, tc.want) {
			t.Errorf("breaches(%+v) = %q, want %q", tc.stats, got, tc.want)
		}
	}
}

// status --check exits 1 while a target lags or has parked rows past the
// thresholds, naming each on stderr (and in --json's check); 0 within them.
// Without --check, status exits 0 whatever it reads.
func TestStatusCheck(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	env := map[string]string{"RELAY_DATABASE_URL": testenv.DatabaseURL(t), "RELAY_OUTBOX_TABLE": table.String()}
	if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload, created_at) VALUES ('t.old', 'a', now() - interval '2 hours')`); err != nil {
		t.Fatal(err)
	}
	type step struct {
		args   []string
		code   int
		stderr []string // each in a line of its own
	}
	lagging := []step{
		{[]string{"status"}, exitOK, nil},
		{[]string{"status", "--check"}, exitFailure, []string{"relayd status: amqp: lag 2h", "relayd status: nats: lag 2h"}},
		{[]string{"status", "--check", "--max-lag", "3h"}, exitOK, nil},
		{[]string{"status", "--targets", "nats", "--check"}, exitFailure, []string{"relayd status: nats: lag 2h"}},
	}
	parked := []step{
		{[]string{"status", "--check", "--max-lag", "3h"}, exitFailure, []string{"relayd status: amqp: 1 parked, over --max-parked 0"}},
		{[]string{"status", "--check", "--max-parked", "1"}, exitOK, nil},
	}
	run := func(steps []step) {
		t.Helper()
		for _, s := range steps {
			code, out, errOut := runCLI(t, env, s.args...)
			lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
			if errOut == "" {
				lines = nil
			}
			ok := code == s.code && len(lines) == len(s.stderr) && strings.HasPrefix(out, "outbox ")
			for i := range min(len(lines), len(s.stderr)) {
				ok = ok && strings.HasPrefix(lines[i], s.stderr[i])
			}
			if !ok {
				t.Errorf("relayd %v: exit %d, stderr %q; want %d and %q\n%s", s.args, code, errOut, s.code, s.stderr, out)
			}
		}
	}
	run(lagging)
	testenv.SetState(t, pool, table, "amqp_parked_at = now(), amqp_last_error = 'refused', nats_delivered_at = now()", "topic = 't.old'")
	run(parked)

	code, out, _ := runCLI(t, env, "status", "--check", "--json", "--max-lag", "3h")
	var doc struct {
		Check struct {
			OK            bool     `json:"ok"`
			MaxLagSeconds float64  `json:"max_lag_seconds"`
			MaxParked     int64    `json:"max_parked"`
			Breaches      []string `json:"breaches"`
		} `json:"check"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitFailure || doc.Check.OK || doc.Check.MaxLagSeconds != 3*3600 ||
		!slices.Equal(doc.Check.Breaches, []string{"amqp: 1 parked, over --max-parked 0"}) {
		t.Errorf("status --check --json: exit %d, %+v (%v)\n%s", code, doc.Check, err, out)
	}
}

// --check's thresholds are refused without it, and below 0.
func TestStatusCheckUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "--max-lag", "5m"}, "--max-lag is a threshold of --check"},
		{[]string{"status", "--max-parked", "3"}, "--max-parked is a threshold of --check"},
		{[]string{"status", "--check", "--max-lag", "-1s"}, "must be 0 or more"},
		{[]string{"status", "--check", "--max-parked", "-1"}, "must be 0 or more"},
		{[]string{"status", "--check", "--max-parked", "many"}, `invalid value "many" for flag --max-parked`},
	} {
		code, out, errOut := runCLI(t, base(), tc.args...)
		if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("relayd %v: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}
