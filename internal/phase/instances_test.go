package phase_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/phase/phasetest"
	"github.com/relayd/relayd/internal/testenv"
)

// Running lists the relays whose presence session lives, and those of an
// earlier version (no pid) that wrote their row within Seen; Astray picks
// those not in a phase.
func TestRunningAstray(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	started := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	in := func(name string, p phase.Name, pinned bool, v string) phase.Instance {
		return phase.Instance{Instance: name, Phase: p, Pinned: pinned, Version: v, StartedAt: started}
	}
	phasetest.Relay(t, pool, table, in("b:2", phase.AMQP, true, "v1"))
	a, _ := phasetest.Relay(t, pool, table, in("a:1", phase.Dual, false, "v2"))
	_, killed := phasetest.Relay(t, pool, table, in("c:3", phase.Dual, false, "v2"))
	// Rows no live presence lock backs: relays of an earlier version, seen
	// a second and a minute ago, and a row whose pid is a session that
	// took no presence lock.
	var other int32
	if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&other); err != nil {
		t.Fatal(err)
	}
	for _, row := range []struct {
		name string
		pid  *int32
		ago  time.Duration
	}{{"d:4", nil, time.Second}, {"e:5", nil, time.Minute}, {"f:6", &other, 0}} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+table.Side("instances")+` (instance, phase, pinned, version, started_at, pid, seen_at)
			VALUES ($1, 'dual', false, 'v0', $2, $3, now() - $4 * interval '1 millisecond')`, row.name, started, row.pid, row.ago.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	names := func() []string {
		t.Helper()
		running, err := phase.Running(ctx, pool, table)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range running {
			out = append(out, r.Instance)
		}
		return out
	}
	if got, want := names(), []string{"a:1", "b:2", "c:3", "d:4"}; !slices.Equal(got, want) {
		t.Fatalf("Running: %v, want %v", got, want)
	}
	// c:3 is killed: its session ends with its connection.
	killed.Close(ctx)
	testenv.Eventually(t, 10*time.Second, func() bool { return !slices.Contains(names(), "c:3") }, "c:3 still listed after its session closed")

	running, err := phase.Running(ctx, pool, table)
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != 3 {
		t.Fatalf("Running: %+v, want a:1, b:2, d:4", running)
	}
	for _, r := range running {
		maxAge := time.Duration(0) // a live session is seen now
		if r.Instance == "d:4" {
			maxAge = phase.Seen
		}
		if r.Age < 0 || r.Age > maxAge || !r.StartedAt.Equal(started) {
			t.Errorf("%s: age %v, started %v; want within %v, started %v", r.Instance, r.Age, r.StartedAt, maxAge, started)
		}
	}
	if b := running[1]; b.Phase != phase.AMQP || !b.Pinned || b.Version != "v1" {
		t.Errorf("b:2: %+v", b)
	}
	astray := phase.Astray(running, phase.Dual)
	if len(astray) != 1 || astray[0].Instance != "b:2" {
		t.Errorf("Astray from dual: %+v, want b:2", astray)
	}
	if err := a.Leave(ctx, "a:1"); err != nil {
		t.Fatal(err)
	}
	if got, want := names(), []string{"b:2", "d:4"}; !slices.Equal(got, want) {
		t.Errorf("after a:1 left: %v, want %v", got, want)
	}
}

// A relay's report is written when asked, not to stay listed: a session
// that reports once is listed until it ends, its row never rewritten. Its
// keepalives end it within seconds of its host vanishing.
func TestPresenceWritesNothingToStayListed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	p, conn := phasetest.Relay(t, pool, table, phase.Instance{Instance: "a:1", Phase: phase.Dual, Version: "v", StartedAt: time.Now()})
	version := func() (v string) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT xmin::text || ctid::text FROM `+table.Side("instances")+` WHERE instance = 'a:1'`).Scan(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	first := version()
	for range 20 {
		if err := p.Check(ctx); err != nil {
			t.Fatal(err)
		}
		if running, err := phase.Running(ctx, pool, table); err != nil || len(running) != 1 {
			t.Fatalf("Running: %+v, %v; want a:1", running, err)
		}
	}
	if v := version(); v != first {
		t.Errorf("the row was rewritten (version %s, then %s): a held horizon would keep each", first, v)
	}
	if err := p.Report(ctx, phase.Instance{Instance: "a:1", Phase: phase.NATS, Version: "v", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if running, err := phase.Running(ctx, pool, table); err != nil || len(running) != 1 || running[0].Phase != phase.NATS {
		t.Errorf("after a report of phase nats: %+v, %v", running, err)
	}
	for setting, want := range map[string]string{"tcp_keepalives_idle": "5", "tcp_keepalives_interval": "2", "tcp_keepalives_count": "3", "tcp_user_timeout": "15000"} {
		var got string
		if err := conn.QueryRow(ctx, "SHOW "+setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s on the presence session, want %s", setting, got, want)
		}
	}
}

// A session that reuses a killed relay's backend pid drops that relay's
// row as it takes its presence lock, so the row is not listed as its.
func TestPresenceDropsTheRowOfAReusedPid(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `INSERT INTO `+table.Side("instances")+` (instance, phase, pinned, version, started_at, pid)
		VALUES ('killed:1', 'amqp', false, 'v', now(), pg_backend_pid())`); err != nil {
		t.Fatal(err)
	}
	if _, err := phase.Present(ctx, conn, table); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+table.Side("instances")).Scan(&n); err != nil || n != 0 {
		t.Errorf("%d rows after Present, %v; want the killed relay's gone", n, err)
	}
}

// Prune forgets the relays not running whose rows were last written
// ForgetAfter ago; a running relay stays, however old its row.
func TestPruneForgetsGoneRelays(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	p, _ := phasetest.Relay(t, pool, table, phase.Instance{Instance: "a:1", Phase: phase.Dual, Version: "v", StartedAt: time.Now()})
	_, killed := phasetest.Relay(t, pool, table, phase.Instance{Instance: "b:2", Phase: phase.Dual, Version: "v", StartedAt: time.Now()})
	_, killedLong := phasetest.Relay(t, pool, table, phase.Instance{Instance: "c:3", Phase: phase.Dual, Version: "v", StartedAt: time.Now()})
	killed.Close(ctx)
	killedLong.Close(ctx)
	for _, row := range []struct {
		name string
		ago  time.Duration
	}{{"a:1", phase.ForgetAfter + time.Hour}, {"b:2", phase.ForgetAfter - time.Hour}, {"c:3", phase.ForgetAfter + time.Minute}} {
		if _, err := pool.Exec(ctx, `UPDATE `+table.Side("instances")+` SET seen_at = now() - $2 * interval '1 millisecond' WHERE instance = $1`,
			row.name, row.ago.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	for _, row := range []struct { // relays of an earlier version
		name string
		ago  time.Duration
	}{{"d:4", phase.ForgetAfter - time.Hour}, {"e:5", phase.ForgetAfter + time.Minute}} {
		if _, err := pool.Exec(ctx, `INSERT INTO `+table.Side("instances")+` (instance, phase, pinned, version, started_at, seen_at)
			VALUES ($1, 'dual', false, 'v0', now(), now() - $2 * interval '1 millisecond')`, row.name, row.ago.Milliseconds()); err != nil {
			t.Fatal(err)
		}
	}
	// The killed sessions' locks go as their backends exit.
	testenv.Eventually(t, 10*time.Second, func() bool {
		running, err := phase.Running(ctx, pool, table)
		return err == nil && len(running) == 1
	}, "the killed relays still listed")
	if err := p.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	var names []string
	if err := pool.QueryRow(ctx, `SELECT coalesce(array_agg(instance ORDER BY instance), '{}') FROM `+table.Side("instances")).Scan(&names); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a:1", "b:2", "d:4"}; !slices.Equal(names, want) {
		t.Errorf("after a prune: %v, want %v", names, want)
	}
}
