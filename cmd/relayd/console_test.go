package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/backfill"
	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/headers"
	"github.com/relayd/relayd/internal/headers/amqpprop"
	"github.com/relayd/relayd/internal/metrics"
	"github.com/relayd/relayd/internal/pghealth"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/replay"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// consoleT0 is the tests' clock at their start.
var consoleT0 = time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)

// fakeClock is a clock the test moves. Safe for concurrent use.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeRelay is a relayState with fixed answers.
type fakeRelay struct {
	phase   relay.PhaseState
	unready []string
}

func (f fakeRelay) Phase() relay.PhaseState { return f.phase }
func (f fakeRelay) Unready() []string       { return f.unready }

// consoleFixture is what one console is rendered from.
type consoleFixture struct {
	relay    fakeRelay
	data     pageData
	stats    []relay.TargetStats
	health   *pghealth.Health
	groups   []cutover.Group
	check    cutover.Result
	checkErr error
}

// setupConsole is a console over f, its clock at consoleT0 plus a minute,
// the stats read every 5s for the minute before, the health and the page's
// data at the end.
func setupConsole(t *testing.T, f consoleFixture) (*console, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: consoleT0}
	figures := newConsoleFigures(clock.now)
	for range 12 {
		clock.advance(5 * time.Second)
		if f.stats != nil {
			figures.setStats(f.stats)
		}
	}
	f.data.readAt = clock.now()
	cc := consoleConfig{
		Table: schema.MustParseTable("shop.outbox"), Interval: 5 * time.Second, Relay: f.relay, Figures: figures,
		Load:   func(context.Context) (pageData, error) { return f.data, nil },
		Groups: f.groups, Self: "relay-a:1", Now: clock.now,
	}
	if f.health != nil {
		at := clock.now()
		cc.Health = func() (pghealth.Health, time.Time) { return *f.health, at }
	}
	if f.groups != nil {
		cc.Check = func(context.Context) (cutover.Result, error) { return f.check, f.checkErr }
	}
	return newConsole(cc), clock
}

// get serves path from c's routes.
func get(t *testing.T, c *console, path string) (int, string) {
	t.Helper()
	mux := http.NewServeMux()
	c.register(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

var dual = []relay.Target{relay.TargetAMQP, relay.TargetNATS}

// fullFixture has something in every section: the table in dual, nats
// paused, a relay pinned to amqp, parked rows, a replay under way, a
// backfill moving, a long transaction.
func fullFixture() consoleFixture {
	started := consoleT0.Add(-time.Hour)
	return consoleFixture{
		relay: fakeRelay{
			phase:   relay.PhaseState{Running: dual, Table: dual},
			unready: []string{"nats: nats: RECONNECTING"},
		},
		data: pageData{
			phase: phaseState{
				Phase: &phaseJSON{Change: phase.Change{Phase: phase.Dual, ChangedAt: consoleT0.Add(-2 * time.Hour), ChangedBy: "alice@ops", Reason: "step 1 of the runbook"}},
				Relays: []relayJSON{
					{Instance: phase.Instance{Instance: "relay-a:1", Phase: phase.Dual, Version: "v1.4.0", StartedAt: started, Age: time.Second}},
					{Instance: phase.Instance{Instance: "relay-b:7", Phase: phase.AMQP, Pinned: true, Version: "v1.3.2", StartedAt: started, Age: 3 * time.Second}, Differs: true},
				},
				History: []phase.Change{
					{Phase: phase.AMQP, ChangedAt: consoleT0.Add(-48 * time.Hour), ChangedBy: "bob@ops", Reason: "start"},
					{Phase: phase.Dual, ChangedAt: consoleT0.Add(-2 * time.Hour), ChangedBy: "alice@ops", Reason: "step 1 of the runbook"},
				},
			},
			parked: []relay.ParkedRow{
				{ID: 42, Topic: "orders.created", Targets: []relay.ParkedTargetInfo{{Target: relay.TargetNATS, ParkedAt: consoleT0, Attempts: 20, Reason: "gave up after 20 attempts: nats: subject not captured by the stream"}}},
				{ID: 17, Topic: "orders.paid", Targets: []relay.ParkedTargetInfo{
					{Target: relay.TargetAMQP, ParkedAt: consoleT0, Attempts: 1, Reason: "permanent: amqp: routing key longer than 255 bytes"},
					{Target: relay.TargetNATS, ParkedAt: consoleT0, Attempts: 1, Reason: "permanent: nats: headers: key \"a b\": NATS takes printable ASCII"},
				}},
			},
			replay: &replay.Record{ID: 3, Stream: "OUTBOX", Exchange: "outbox", FromSeq: 1001, ToSeq: 5000, Position: 2000,
				StartedAt: consoleT0.Add(-145 * time.Second), UpdatedAt: consoleT0.Add(55 * time.Second)},
			pace:  &replayPace{perSecond: 5, over: 5 * time.Second},
			moved: []backfill.Moved{{Queue: "q_billing", Count: 601, First: consoleT0, Last: consoleT0.Add(60 * time.Second)}},
		},
		stats: []relay.TargetStats{
			{Target: relay.TargetAMQP, Pending: 3, PendingExact: true, Lag: 2 * time.Second},
			{Target: relay.TargetNATS, Pending: 20000, Lag: 90 * time.Second, Retrying: 5, Parked: 2, HeldKeys: 1, LastError: "nats: RECONNECTING"},
		},
		health: &pghealth.Health{
			Horizon: []pghealth.Holder{{Kind: "snapshot", PID: 4242, Name: "pg_dump", State: "active", XIDs: 1200, Age: 2 * time.Hour, AgeKnown: true}},
			Tables:  []pghealth.Table{{Table: "outbox", DeadTuples: 10, LiveTuples: 5, Bytes: 98304}},
		},
		groups: []cutover.Group{{Stream: "ORDERS", Consumer: "billing", Queue: "q_billing", Path: cutover.DualRead, Label: "ORDERS/billing"}},
	}
}

// emptyFixture is a fresh outbox: no phase set, nothing read yet.
func emptyFixture() consoleFixture {
	return consoleFixture{relay: fakeRelay{phase: relay.PhaseState{Running: dual}}, data: pageData{phase: phaseState{}}}
}

// The page shows each section from fixed data, in the DOM the browser test
// reads, paused and healthy targets, and every empty state.
func TestConsoleRenders(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fixture consoleFixture
		want    []string
		not     []string
	}{
		{"every section", fullFixture(), []string{
			`<main id="console" data-refresh="5">`,
			`<noscript><meta http-equiv="refresh" content="5"></noscript>`,
			`<meta name="viewport"`,
			`<section id="phase">`, `<span id="table-phase" class="phase-dual">dual</span>`,
			"Set 2026-12-06 10:00:00Z by alice@ops: step 1 of the runbook",
			"This relay: phase dual (the table&#39;s)",
			"relay-b:7 runs amqp (pinned by its RELAY_TARGETS",
			`<tr><td>2026-12-04 12:00:00Z</td><td>amqp</td><td>bob@ops</td><td>start</td></tr>`,
			`<section id="targets">`,
			`<article class="target" data-target="amqp" data-state="ok" data-running="true">`,
			`<article class="target" data-target="nats" data-state="paused" data-running="true">`,
			`<p class="reason">nats: RECONNECTING</p>`,
			`<dd class="lag">2s</dd>`, `<dd class="pending">~20000</dd>`, `<dd class="retrying">5</dd>`, `<dd class="parked">2</dd>`,
			`<svg class="lag-chart"`, "at most 1m30s",
			`<table id="instances">`, `<tr data-instance="relay-a:1">`, `<tr data-instance="relay-b:7" class="astray">`, "(this one)",
			`<table id="parked">`, `<tr data-id="42">`, `<td class="reason">gave up after 20 attempts: nats: subject not captured by the stream</td>`,
			`<tr data-id="17">`, `<td class="target">amqp, nats</td>`,
			"The 2 parked rows written last (the highest ids), the last first.",
			"RELAY_OUTBOX_TABLE=shop.outbox relayd outbox retry --target amqp --id 17",
			"RELAY_OUTBOX_TABLE=shop.outbox relayd outbox retry --target nats --id 17,42",
			"RELAY_OUTBOX_TABLE=shop.outbox relayd outbox retry --all",
			`<section id="cutover">`, `<a href="/cutover">`, "ORDERS/billing: dual read, consumer billing of stream ORDERS, legacy queue q_billing",
			`<section id="runs">`, "sequence 2000 of 1001–5000, 1000 of 4000 done (25.0 %), 5.0 msg/s over the 5s since the page last read it, about 10m0s left at that rate; last progress 5s ago.",
			"Backfill of queue q_billing: 601 moved in the last 1m0s, 10 msg/s averaged over it; the last move just now.",
			"no progress or ETA for it here",
			`<section id="horizon">`, "held by a snapshot (pg_dump, pid 4242, active) for 2h0m0s, 1200 transaction ids back",
			"outbox 10 dead, 5 live, 96 kB",
		}, nil},
		{"empty", emptyFixture(), []string{
			`<span id="table-phase" class="phase-none">none</span>`, phaseNotSet,
			`<article class="target" data-target="amqp" data-state="ok"`, `<article class="target" data-target="nats" data-state="ok"`,
			"Its figures are not read yet.", "too few readings yet",
			`<table id="instances">`, "No relay reports itself",
			`<table id="parked">`, "No row is parked.",
			`<a href="/cutover">`, "No consumer group is configured", "RELAY_CONSOLE_CUTOVER=",
			"No replay run is recorded (shop.outbox_replay).", "No backfill has moved a message",
			"VACUUM&#39;s horizon: not read yet.",
		}, []string{`<tr data-instance=`, `<tr data-id=`, "relayd outbox retry", `class="reason"`}},
		{"phase amqp: nats not relayed", func() consoleFixture {
			f := emptyFixture()
			f.relay.phase = relay.PhaseState{Running: []relay.Target{relay.TargetAMQP}, Table: []relay.Target{relay.TargetAMQP}}
			f.data.phase.Phase = &phaseJSON{Change: phase.Change{Phase: phase.AMQP, ChangedAt: consoleT0, ChangedBy: "bob"}}
			f.stats = []relay.TargetStats{{Target: relay.TargetAMQP, PendingExact: true}}
			f.health = &pghealth.Health{Horizon: []pghealth.Holder{{Kind: "transaction", Name: "psql", Age: time.Second, AgeKnown: true}}}
			return f
		}(), []string{
			`<span id="table-phase" class="phase-amqp">amqp</span>`,
			`data-target="nats" data-state="ok" data-running="false"`, "This relay does not publish to nats in its phase, amqp.",
			`<dd class="lag">0s</dd>`, "Nothing holds VACUUM&#39;s horizon back for long.",
		}, []string{"held by a transaction"}},
		{"read failures and a stopped replay", func() consoleFixture {
			f := emptyFixture()
			f.relay.phase.Table = []relay.Target{relay.TargetNATS}
			f.data.errs = map[string]error{"phase": errors.New("read the phase: timeout"), "parked": errors.New("list parked: timeout")}
			f.data.replay = &replay.Record{ID: 9, FromSeq: 1, ToSeq: 10, Position: 4, StartedAt: consoleT0.Add(-2 * time.Hour), UpdatedAt: consoleT0.Add(-time.Hour)}
			f.relay.unready = []string{"phase: the table's phase not read from Postgres yet: not claiming"}
			return f
		}(), []string{
			`<span id="table-phase" class="phase-nats">nats</span>`, "as this relay last read it",
			"Could not read the phase, its history and the relays: read the phase: timeout",
			"Could not read the parked rows: list parked: timeout",
			"phase: the table&#39;s phase not read from Postgres yet: not claiming",
			"It is not moving: the run stopped",
		}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, _ := setupConsole(t, tc.fixture)
			code, page := get(t, c, "/")
			if code != http.StatusOK {
				t.Fatalf("GET / = %d: %s", code, page)
			}
			for _, w := range tc.want {
				if !strings.Contains(page, w) {
					t.Errorf("the page lacks %q", w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(page, n) {
					t.Errorf("the page has %q", n)
				}
			}
			_, main := get(t, c, "/?part=main")
			if !strings.HasPrefix(main, `<main id="console"`) || !strings.Contains(page, main) {
				t.Errorf("?part=main is not the page's main element:\n%s", main)
			}
			if t.Failed() {
				t.Logf("page:\n%s", page)
			}
		})
	}
}

// /cutover checks on demand: a line per condition, green or saying what is
// missing, the relays' versions among them; without groups, how to
// configure them.
func TestConsoleCutoverPage(t *testing.T) {
	groups := fullFixture().groups
	res := cutover.Result{Groups: groups, Conditions: []cutover.Condition{
		{Name: cutover.CondOutbox, OK: true, Detail: "nothing parked for nats"},
		{Group: "ORDERS/billing", Name: cutover.CondQueue, OK: false, Detail: "q_billing has 12 ready"},
	}}
	ready := cutover.Result{OK: true, Groups: groups, Conditions: res.Conditions[:1]}
	mixed := fullFixture().data.phase.Relays // v1.4.0 and v1.3.2
	same := []relayJSON{mixed[0], mixed[0]}
	same[1].Instance.Instance = "relay-c:9"
	for _, tc := range []struct {
		name   string
		groups []cutover.Group
		relays []relayJSON
		data   pageData // when relays is nil
		res    cutover.Result
		err    error
		want   []string
	}{
		{"not ready", groups, same, pageData{}, res, nil, []string{
			`<li class="condition" data-ok="true">`, `<li class="condition" data-ok="false">`,
			"<strong>legacy queue</strong> <span class=\"muted\">group ORDERS/billing</span>: q_billing has 12 ready",
			`data-ok="false">Not ready: 1 of 3 conditions do not hold.`,
		}},
		{"ready", groups, same, pageData{}, ready, nil, []string{
			`data-ok="true"><span class="mark">✓</span> <strong>relayd versions</strong>: v1.4.0 on relay-a:1, relay-c:9</li>`,
			`data-ok="true">Ready: group ORDERS/billing may read JetStream only.`,
		}},
		{"two versions", groups, mixed, pageData{}, ready, nil, []string{
			`data-ok="false"><span class="mark">✗</span> <strong>relayd versions</strong>: v1.3.2 on relay-b:7; v1.4.0 on relay-a:1</li>`,
			`data-ok="false">Not ready: 1 of 2 conditions do not hold.`,
		}},
		{"no relay", groups, nil, pageData{}, ready, nil, []string{
			`data-ok="false"><span class="mark">✗</span> <strong>relayd versions</strong>: no relay reports itself</li>`,
		}},
		{"relays not read", groups, nil, pageData{errs: map[string]error{"phase": errors.New("read the relays: timeout")}}, ready, nil, []string{
			`<strong>relayd versions</strong>: could not read the relays&#39; reports: read the relays: timeout</li>`,
		}},
		{"no answer", groups, same, pageData{}, cutover.Result{}, errors.New("nats at 127.0.0.1:4222 did not answer within 5s"), []string{
			"The check could not be made: nats at 127.0.0.1:4222 did not answer within 5s",
		}},
		{"no groups", nil, nil, pageData{}, cutover.Result{}, nil, []string{"No consumer group is configured", "RELAY_CONSOLE_CUTOVER"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := emptyFixture()
			f.groups, f.check, f.checkErr = tc.groups, tc.res, tc.err
			if tc.relays != nil {
				f.data.phase.Relays = tc.relays
			} else {
				f.data = tc.data
			}
			c, _ := setupConsole(t, f)
			code, page := get(t, c, "/cutover")
			if code != http.StatusOK {
				t.Fatalf("GET /cutover = %d", code)
			}
			for _, w := range append(tc.want, `<main id="console">`) {
				if !strings.Contains(page, w) {
					t.Errorf("/cutover lacks %q:\n%s", w, page)
				}
			}
			if strings.Contains(page, "http-equiv") {
				t.Error("/cutover refreshes itself: each refresh would ask the brokers")
			}
		})
	}
}

// /cutover says when the check it shows ran, not when the page was made:
// a verdict serves every request for an interval.
func TestConsoleCutoverCheckedAt(t *testing.T) {
	f := emptyFixture()
	f.groups, f.check = fullFixture().groups, cutover.Result{Groups: fullFixture().groups}
	c, clock := setupConsole(t, f)
	checked := clock.now()
	get(t, c, "/cutover")
	clock.advance(3 * time.Second)
	_, page := get(t, c, "/cutover")
	for _, w := range []string{"Checked at " + timeText(checked) + ".", `id="generated">` + timeText(checked.Add(3*time.Second))} {
		if !strings.Contains(page, w) {
			t.Errorf("/cutover lacks %q:\n%s", w, page)
		}
	}
}

// The horizon section names a holder once it has held the horizon for
// metrics.HolderInfoAfter, as the metrics and alerts do, with the age
// metrics.Postgres works out where Postgres gives none: a standby or a slot
// that always holds some horizon is no warning.
func TestConsoleHorizon(t *testing.T) {
	standby := pghealth.Holder{Kind: "standby", PID: 77, Name: "walreceiver", State: "streaming", XIDs: 3}
	aged := func(x pghealth.Holder, age time.Duration, known bool) pghealth.Holder {
		x.Age, x.AgeKnown = age, known
		return x
	}
	for _, tc := range []struct {
		name   string
		holder pghealth.Holder
		held   string // "": nothing held
	}{
		{"a standby just seen", aged(standby, 0, false), ""},
		{"a standby seen for less than HolderInfoAfter", aged(standby, metrics.HolderInfoAfter-time.Second, false), ""},
		{"a standby seen for HolderInfoAfter", aged(standby, 2*time.Minute, false),
			"held by a standby (walreceiver, pid 77, streaming) for at least 2m0s (since relayd first saw it), 3 transaction ids back"},
		{"a short transaction", pghealth.Holder{Kind: "transaction", Name: "app", Age: 30 * time.Second, AgeKnown: true}, ""},
		{"a long snapshot", pghealth.Holder{Kind: "snapshot", Name: "pg_dump", Age: time.Hour, AgeKnown: true, XIDs: 9},
			"held by a snapshot (pg_dump) for 1h0m0s, 9 transaction ids back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := emptyFixture()
			f.health = &pghealth.Health{Horizon: []pghealth.Holder{tc.holder}}
			c, _ := setupConsole(t, f)
			_, page := get(t, c, "/")
			want, not := "Nothing holds VACUUM&#39;s horizon back for long.", "held by"
			if tc.held != "" {
				want, not = tc.held, "Nothing holds"
			}
			if !strings.Contains(page, want) || strings.Contains(page, not) {
				t.Errorf("the page lacks %q or has %q:\n%s", want, not, page)
			}
		})
	}
	t.Run("read from metrics.Postgres", func(t *testing.T) {
		pg := metrics.NewPostgres(prometheus.NewRegistry())
		c, _ := setupConsole(t, emptyFixture())
		c.cfg.Health = pg.Last
		pg.Set(pghealth.Health{Horizon: []pghealth.Holder{standby}})
		if _, page := get(t, c, "/"); !strings.Contains(page, "Nothing holds VACUUM&#39;s horizon back for long.") {
			t.Errorf("a standby metrics.Postgres first saw just now shows as held:\n%s", page)
		}
	})
}

// A shared read runs while a request waits for it: when the last one has
// gone, its context is cancelled and its result dropped, and the next
// request loads afresh.
func TestSharedReadCancel(t *testing.T) {
	clock := &fakeClock{t: consoleT0}
	started, returned := make(chan context.Context, 2), make(chan struct{}, 2)
	var loads atomic.Int64
	s := &sharedRead[int]{ttl: time.Second, now: clock.now, timeout: time.Hour}
	s.load = func(ctx context.Context) (int, error) {
		n := loads.Add(1)
		if n > 1 {
			return int(n), nil
		}
		started <- ctx
		<-ctx.Done()
		returned <- struct{}{}
		return 0, ctx.Err()
	}
	joinedCh := make(chan struct{}, 1)
	s.joined = func() { joinedCh <- struct{}{} }

	first, leaveFirst := context.WithCancel(context.Background())
	second, leaveSecond := context.WithCancel(context.Background())
	errs := make(chan error, 2)
	go func() { _, _, err := s.get(first); errs <- err }()
	lctx := <-started
	go func() { _, _, err := s.get(second); errs <- err }()
	<-joinedCh

	leaveFirst()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first request, gone: %v", err)
	}
	if lctx.Err() != nil {
		t.Fatal("the load was cancelled while a request still waited for it")
	}
	leaveSecond()
	if err := <-errs; !errors.Is(err, context.Canceled) {
		t.Fatalf("the second request, gone: %v", err)
	}
	if lctx.Err() == nil {
		t.Fatal("the load runs on after the last request waiting for it has gone")
	}
	<-returned
	if v, _, err := s.get(context.Background()); v != 2 || err != nil {
		t.Errorf("the next request got %d, %v; want a new load's 2, nil", v, err)
	}
}

// A load that panics ends its flight with an error: the requests waiting
// return, and once the error is stale the next request loads again.
func TestSharedReadPanic(t *testing.T) {
	clock := &fakeClock{t: consoleT0}
	var loads atomic.Int64
	s := &sharedRead[int]{ttl: time.Second, now: clock.now, timeout: time.Hour}
	s.load = func(context.Context) (int, error) {
		if loads.Add(1) == 1 {
			panic("a bug")
		}
		return 7, nil
	}
	if _, _, err := s.get(context.Background()); err == nil || !strings.Contains(err.Error(), "a bug") {
		t.Fatalf("a panicking load: %v, want its panic as an error", err)
	}
	clock.advance(time.Second)
	if v, _, err := s.get(context.Background()); v != 7 || err != nil {
		t.Errorf("after a panic: %d, %v; want 7, nil", v, err)
	}
}

// The console's check samples Postgres and the brokers every
// RELAY_STATS_INTERVAL while it watches, not cutover's default 500ms.
func TestConsoleCutoverPoll(t *testing.T) {
	for _, interval := range []string{"5s", "30s"} {
		cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(with(with(base(), "RELAY_STATS_INTERVAL", interval), "RELAY_CONSOLE_CUTOVER", "dual-read=billing")))
		if err != nil || cfg.validateRun() != nil {
			t.Fatal(err)
		}
		if got := consoleCutoverConfig(cfg, nil, nil, nil).Poll; got != cfg.StatsInterval || got == 0 {
			t.Errorf("RELAY_STATS_INTERVAL=%s: the check polls every %s", interval, got)
		}
	}
}

// The runs section: a backfill's rate is what it moved over the window the
// page reads; a replay's is its pace between two page reads, with no ETA
// before there are two.
func TestConsoleRuns(t *testing.T) {
	now := consoleT0.Add(time.Minute)
	resumed := &replay.Record{ID: 4, Stream: "OUTBOX", Exchange: "outbox", FromSeq: 1, ToSeq: 10000, Position: 1000,
		StartedAt: now.Add(-24 * time.Hour), UpdatedAt: now.Add(-time.Second)} // stopped for most of a day
	for _, tc := range []struct {
		name string
		data pageData
		want []string
		not  []string
	}{
		{"a backfill's few batches", pageData{moved: []backfill.Moved{{Queue: "q", Count: 3, First: now.Add(-10 * time.Second), Last: now.Add(-8 * time.Second)}}},
			[]string{"Backfill of queue q: 3 moved in the last 1m0s, 0.05 msg/s averaged over it; the last move 8s ago."}, []string{"1.0 msg/s"}},
		{"a backfill's one batch", pageData{moved: []backfill.Moved{{Queue: "q", Count: 600, First: now, Last: now}}},
			[]string{"600 moved in the last 1m0s, 10 msg/s averaged over it"}, nil},
		{"a resumed replay, read once", pageData{replay: resumed},
			[]string{"1000 of 10000 done (10.0 %); rate and ETA once the page has read it twice; last progress 1s ago."}, []string{"msg/s", "left at that rate"}},
		{"a resumed replay, read twice", pageData{replay: resumed, pace: &replayPace{perSecond: 100, over: 5 * time.Second}},
			[]string{"100 msg/s over the 5s since the page last read it, about 1m30s left at that rate"}, nil},
		{"a replay not moving", pageData{replay: resumed, pace: &replayPace{over: 5 * time.Second}},
			[]string{"0.0 msg/s over the 5s since the page last read it;"}, []string{"left at that rate"}},
		{"both not read", pageData{errs: map[string]error{"runs": errors.Join(errors.New("read the replay record: timeout"), errors.New("read the backfill's moves: timeout"))}},
			[]string{"read the replay record: timeout", "read the backfill&#39;s moves: timeout"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := emptyFixture()
			f.data = tc.data
			c, clock := setupConsole(t, f)
			if !clock.now().Equal(now) {
				t.Fatalf("the clock is at %v, want %v", clock.now(), now)
			}
			_, page := get(t, c, "/")
			for _, w := range tc.want {
				if !strings.Contains(page, w) {
					t.Errorf("the page lacks %q", w)
				}
			}
			runs := page[strings.Index(page, `<section id="runs">`):]
			runs = runs[:strings.Index(runs, "</section>")]
			for _, n := range tc.not {
				if strings.Contains(runs, n) {
					t.Errorf("the runs section has %q:\n%s", n, runs)
				}
			}
		})
	}
}

// A replay run's pace is measured between two page reads of the same
// unfinished run.
func TestReplayPaces(t *testing.T) {
	run := func(id int64, pos uint64, finished bool) replay.Record {
		r := replay.Record{ID: id, Position: pos}
		if finished {
			r.FinishedAt = &consoleT0
		}
		return r
	}
	var p replayPaces
	at := consoleT0
	for _, step := range []struct {
		after time.Duration
		run   replay.Record
		want  *replayPace
	}{
		{0, run(1, 100, false), nil},
		{5 * time.Second, run(1, 600, false), &replayPace{perSecond: 100, over: 5 * time.Second}},
		{10 * time.Second, run(1, 600, false), &replayPace{perSecond: 0, over: 10 * time.Second}},
		{0, run(1, 700, false), nil}, // a read that began earlier
		{5 * time.Second, run(2, 50, false), nil},
		{5 * time.Second, run(2, 50, true), nil},
	} {
		at = at.Add(step.after)
		got := p.observe(step.run, at)
		if (got == nil) != (step.want == nil) || got != nil && *got != *step.want {
			t.Errorf("run %d at %d, %s later: %+v, want %+v", step.run.ID, step.run.Position, step.after, got, step.want)
		}
	}
}

// No page or fragment shows a password, a payload or a header value, from
// whatever text reaches the console: parked reasons as the sinks write them,
// errors naming a URL, the relay's reasons, the cutover check's details.
func TestConsoleShowsNoSecret(t *testing.T) {
	const password, payload, value1, value2, value3 = "hunter2pw", "PAYLOAD-card-4111", "HDRVAL-prio", "HDRVAL-user", "HDRVAL-ctype"
	url := "amqp://relay:" + password + "@rabbit:5672/"
	var pub amqp.Publishing
	conflict := amqpprop.Fill(&pub, map[string]string{"content-type": value3, "Content-Type": "x" + value3})
	if conflict == nil {
		t.Fatal("amqpprop.Fill took two content types")
	}
	reasons := []string{
		relay.Permanent("amqp: headers: %s", headers.AMQPReason("priority", value1)).Error(),
		relay.Permanent("amqp: headers: %s", headers.AMQPUserIDReason(value2, "relay")).Error(),
		relay.Permanent("amqp: headers: %v", conflict).Error(),
		"gave up after 20 attempts: Exception (406) Reason: \"PRECONDITION_FAILED - invalid expiration '" + value1 + "' for message " + payload + "\"",
		"gave up after 3 attempts: amqp: dial " + url + ": connection refused",
	}
	f := fullFixture()
	for i, r := range reasons {
		f.data.parked = append(f.data.parked, relay.ParkedRow{ID: int64(100 + i), Topic: "t", Targets: []relay.ParkedTargetInfo{{Target: relay.TargetAMQP, Reason: r}}})
	}
	f.data.errs = map[string]error{"runs": errors.New("read the replay record: " + url)}
	f.stats[0].LastError = reasons[0]
	f.stats[1].LastError = reasons[4]
	f.relay.unready = []string{"amqp: " + reasons[1], "nats: nats: connect to nats://relay:" + password + "@nats:4222: refused", "phase: " + reasons[2]}
	f.check = cutover.Result{Groups: f.groups, Conditions: []cutover.Condition{{Name: cutover.CondQueue, Detail: reasons[3]}, {Name: cutover.CondOutbox, Detail: reasons[4]}}}
	c, _ := setupConsole(t, f)
	f.checkErr = errors.New(reasons[4])
	cErr, _ := setupConsole(t, f)
	for _, tc := range []struct {
		c    *console
		path string
	}{
		{c, "/"}, {c, "/?part=main"}, {c, "/cutover"}, {c, "/cutover?part=main"}, {cErr, "/cutover"},
		{c, "/console.js"}, {c, "/console.css"},
	} {
		code, page := get(t, tc.c, tc.path)
		if code != http.StatusOK {
			t.Errorf("GET %s = %d", tc.path, code)
		}
		for _, secret := range []string{password, payload, value1, value2, value3} {
			if strings.Contains(page, secret) {
				t.Errorf("GET %s shows %q:\n%s", tc.path, secret, page)
			}
		}
	}
	// What the reasons say besides stays: a key, the fix.
	_, page := get(t, c, "/")
	for _, w := range []string{`value of &#34;priority&#34; is &#34;…&#34;`, "amqp://relay:xxxxx@rabbit:5672/"} {
		if !strings.Contains(page, w) {
			t.Errorf("the page lacks %q", w)
		}
	}
}

// scrub masks every quoted string but a header's key, and URL passwords.
func TestScrub(t *testing.T) {
	for in, want := range map[string]string{
		"":                                    "",
		"permanent: amqp: routing key longer": "permanent: amqp: routing key longer",
		`value of "priority" is "abc": an AMQP priority is a decimal`: `value of "priority" is "…": an AMQP priority is a decimal`,
		`key "a b": NATS takes printable ASCII`:                       `key "a b": NATS takes printable ASCII`,
		`user-id "x\"y" is not "guest"`:                               `user-id "…" is not "…"`,
		`headers ["a" "b"] with values ["v" "w"]`:                     `headers ["…" "…"] with values ["…" "…"]`,
		"RabbitMQ's frame_max, the server's limit":                    "RabbitMQ's frame_max, the server's limit",
		"invalid expiration 'abc' for message":                        "invalid expiration '…' for message",
		`unterminated "secret`:                                        `unterminated "…`,
		"dial nats://tok@n:4222 and amqp://u:p@h:5672/v":              "dial nats://xxxxx@n:4222 and amqp://u:xxxxx@h:5672/v",
	} {
		if got := scrub(in); got != want {
			t.Errorf("scrub(%q) = %q, want %q", in, got, want)
		}
	}
	if got := scrub(strings.Repeat("é", scrubMax)); len(got) > scrubMax+len("…") || !strings.HasSuffix(got, "…") {
		t.Errorf("a long text is not cut short: %d bytes", len(got))
	}
}

// 20 viewers refreshing every 2s for a minute cost at most one read of the
// page's data per refresh interval, and 20 at once share one read.
func TestConsoleSharesReads(t *testing.T) {
	const viewers, every, minute = 20, 2 * time.Second, time.Minute
	for _, interval := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second} {
		t.Run(interval.String(), func(t *testing.T) {
			var loads atomic.Int64
			f := fullFixture()
			c, clock := setupConsole(t, f)
			c.page.load = func(context.Context) (pageData, error) {
				loads.Add(1)
				return f.data, nil
			}
			c.page.ttl, c.cfg.Interval = interval, interval
			// Each viewer refreshes every 2s, the viewers spread over the 2s.
			const step = every / viewers
			for tick := time.Duration(0); tick < minute; tick += step {
				var wg sync.WaitGroup
				for v := range viewers {
					if tick%every == time.Duration(v)*step {
						wg.Go(func() {
							if code, _ := get(t, c, "/"); code != http.StatusOK {
								t.Errorf("GET / = %d", code)
							}
						})
					}
				}
				wg.Wait()
				clock.advance(step)
			}
			if n, most := loads.Load(), int64(minute/interval)+1; n > most || n == 0 {
				t.Errorf("%d viewers every %s for %s, refresh %s: %d reads, want 1 to %d", viewers, every, minute, interval, n, most)
			}
		})
	}
	t.Run("at once", func(t *testing.T) {
		var loads atomic.Int64
		var joined atomic.Int64
		all := make(chan struct{})
		f := fullFixture()
		c, _ := setupConsole(t, f)
		c.page.joined = func() {
			if joined.Add(1) == viewers-1 {
				close(all)
			}
		}
		c.page.load = func(context.Context) (pageData, error) {
			loads.Add(1)
			<-all // the others wait for this read
			return f.data, nil
		}
		var wg sync.WaitGroup
		for range viewers {
			wg.Go(func() { get(t, c, "/") })
		}
		wg.Wait()
		if n := loads.Load(); n != 1 {
			t.Errorf("%d viewers at once: %d reads, want 1", viewers, n)
		}
	})
}

// The lag history keeps lagWindow, a sample at most every
// lagWindow/lagSamplesMax.
func TestConsoleFigures(t *testing.T) {
	clock := &fakeClock{t: consoleT0}
	f := newConsoleFigures(clock.now)
	stats := []relay.TargetStats{{Target: relay.TargetNATS, Lag: time.Second, Pending: 1}}
	for range 2000 {
		f.setStats(stats)
		clock.advance(time.Second)
	}
	s := f.snapshot()
	if n := len(s.lags); n < lagSamplesMax-1 || n > lagSamplesMax+1 {
		t.Errorf("%d samples kept, want about %d", n, lagSamplesMax)
	}
	if span := s.lags[len(s.lags)-1].at.Sub(s.lags[0].at); span > lagWindow {
		t.Errorf("the samples span %s, want at most %s", span, lagWindow)
	}
	if s.lags[0].has[0] || !s.lags[0].has[1] {
		t.Errorf("a nats-only read charted as %v", s.lags[0].has)
	}
	read := func(context.Context) ([]relay.TargetStats, error) { return nil, errors.New("down") }
	before := f.snapshot().statsAt
	if _, err := f.teeStats(read)(context.Background()); err == nil || !f.snapshot().statsAt.Equal(before) {
		t.Error("a failed read replaced the figures")
	}
}

// RELAY_CONSOLE defaults to true; false leaves / a 404, the other
// endpoints as they were.
func TestConsoleOff(t *testing.T) {
	for _, tc := range []struct {
		set  string
		want int
	}{{"", http.StatusOK}, {"true", http.StatusOK}, {"false", http.StatusNotFound}} {
		env := base()
		if tc.set != "" {
			env["RELAY_CONSOLE"] = tc.set
		}
		cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
		if err != nil {
			t.Fatal(err)
		}
		var routes func(*http.ServeMux)
		if cfg.Console {
			c, _ := setupConsole(t, emptyFixture())
			routes = c.register
		}
		srv, err := startHTTP("127.0.0.1:0", false, prometheus.NewRegistry(), noProbe, routes, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { srv.Close() })
		for path, want := range map[string]int{"/": tc.want, "/cutover": tc.want, "/console.js": tc.want, "/nothing": http.StatusNotFound,
			"/metrics": http.StatusOK, "/healthz": http.StatusOK, "/readyz": http.StatusOK, "/version": http.StatusOK} {
			resp, err := http.Get("http://" + srv.Addr + path)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != want {
				t.Errorf("RELAY_CONSOLE=%q: GET %s = %d, want %d", tc.set, path, resp.StatusCode, want)
			}
		}
	}
}

// RELAY_CONSOLE_CUTOVER takes the groups cutover check takes; a mistake
// is a config error naming it, exit 2, before any connection.
func TestConsoleCutoverSetting(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string // the error; "" none
	}{
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "dual-read=ORDERS/billing:q_billing rolling-upgrade=ledger:q_ledger"}, ""},
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "  dual-read=billing\n"}, ""},
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "bogus", "RELAY_CONSOLE": "false"}, ""},
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "billing"}, `RELAY_CONSOLE_CUTOVER: "billing": want dual-read=GROUP or rolling-upgrade=GROUP`},
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "dual-read="}, `RELAY_CONSOLE_CUTOVER: "": want [STREAM/]DURABLE[:QUEUE]`},
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "rolling-upgrade=a.b"}, `RELAY_CONSOLE_CUTOVER: "a.b": want [STREAM/]DURABLE[:QUEUE]`},
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "dual-read=x rolling-upgrade=x"}, "RELAY_CONSOLE_CUTOVER: consumer x is named twice"},
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "dual-read=x", "RELAY_NATS_STREAM": ""}, "RELAY_CONSOLE_CUTOVER: group x names no stream, and RELAY_NATS_STREAM is empty"},
		{map[string]string{"RELAY_CONSOLE_CUTOVER": "dual-read=x:q", "RELAY_TARGETS": "nats", "RELAY_AMQP_URL": "amqp://u:pa%zzword@h/"}, "RELAY_AMQP_URL: is not a valid URL"},
	} {
		env := base()
		for k, v := range tc.env {
			env[k] = v
		}
		if tc.want != "" {
			var stdout, stderr bytes.Buffer
			code := run([]string{"run"}, &stdout, &stderr, envconfig.MapLookuper(env))
			if code != exitUsage || !strings.Contains(stderr.String(), tc.want) || strings.Contains(stderr.String(), "pa%zzword") {
				t.Errorf("%v: exit %d, %q; want exit 2 and %q", tc.env, code, stderr.String(), tc.want)
			}
			continue
		}
		cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
		if err == nil {
			err = cfg.validateRun()
		}
		if err != nil {
			t.Errorf("%v: %v", tc.env, err)
		}
	}
	cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(with(base(), "RELAY_CONSOLE_CUTOVER", "dual-read=ORDERS/billing:q_billing rolling-upgrade=ledger:q_ledger")))
	if err != nil || cfg.validateRun() != nil {
		t.Fatal(err)
	}
	want := []cutover.Group{
		{Stream: "ORDERS", Consumer: "billing", Queue: "q_billing", Path: cutover.DualRead, Label: "ORDERS/billing"},
		{Stream: "OUTBOX", Consumer: "ledger", Queue: "q_ledger", Path: cutover.RollingUpgrade},
	}
	if fmt.Sprint(cfg.consoleGroups) != fmt.Sprint(want) {
		t.Errorf("groups %+v, want %+v", cfg.consoleGroups, want)
	}
}

func FuzzParseConsoleGroups(f *testing.F) {
	for _, s := range []string{"dual-read=ORDERS/billing:q_billing rolling-upgrade=ledger:q_ledger", "dual-read=a:b:c", "x=y", "dual-read=/a", "rolling-upgrade=a/b/c:"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		gs, err := parseConsoleGroups(spec, "OUTBOX")
		if err != nil {
			return
		}
		for _, g := range gs {
			if !validNATSName(g.Stream) || !validNATSName(g.Consumer) || (g.Path != cutover.DualRead && g.Path != cutover.RollingUpgrade) {
				t.Errorf("%q gave group %+v", spec, g)
			}
		}
	})
}

// pageLoader reads the phase and its history, the parked rows written last,
// the latest replay run and the backfill's recent moves per queue.
func TestConsolePageLoader(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	load := pageLoader(pool, table, time.Now)

	d, err := load(ctx)
	if err != nil || len(d.errs) > 0 {
		t.Fatalf("an empty outbox: %v %v", err, d.errs)
	}
	if d.phase.Phase != nil || len(d.parked) > 0 || d.replay != nil || len(d.moved) > 0 {
		t.Errorf("an empty outbox: %+v", d)
	}

	if _, err := phase.Set(ctx, pool, table, phase.Change{Phase: phase.Dual, ChangedBy: "alice", Reason: "step 1"}, phase.Change{}, false); err != nil {
		t.Fatal(err)
	}
	for i := range parkedShown + 5 {
		if _, err := pool.Exec(ctx, `INSERT INTO `+table.Ident()+` (topic, payload, headers) VALUES ($1, '\x00', '{"authorization": "secret"}')`, fmt.Sprintf("t.%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	testenv.SetState(t, pool, table, "nats_parked_at = now(), nats_attempts = 20, nats_last_error = 'gave up'", "true")
	for _, q := range []string{
		`INSERT INTO ` + table.Side("backfilled") + ` (message_id, queue, moved_at) VALUES ('a', 'q1', now() - interval '10 seconds'), ('b', 'q1', now()), ('c', 'q2', now() - interval '1 hour')`,
		`INSERT INTO ` + table.Side("replay") + ` (stream, exchange, request, from_seq, to_seq, position, finished_at) VALUES ('OUTBOX', 'outbox', 'phase', 1, 10, 10, now())`,
		`INSERT INTO ` + table.Side("replay") + ` (stream, exchange, request, from_seq, to_seq, position) VALUES ('OUTBOX', 'outbox', 'phase', 11, 20, 14)`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}

	if d, err = load(ctx); err != nil || len(d.errs) > 0 {
		t.Fatalf("%v %v", err, d.errs)
	}
	if d.phase.Phase == nil || d.phase.Phase.Phase != phase.Dual || len(d.phase.History) != 1 {
		t.Errorf("phase %+v, history %+v; want dual, one change", d.phase.Phase, d.phase.History)
	}
	if len(d.parked) != parkedShown || d.parked[0].Topic != fmt.Sprintf("t.%d", parkedShown+4) || d.parked[0].ID < d.parked[1].ID {
		t.Errorf("%d parked rows, the first %+v; want the %d written last, the last first", len(d.parked), d.parked[0], parkedShown)
	}
	if p := d.parked[0].Targets; len(p) != 1 || p[0].Target != relay.TargetNATS || p[0].Attempts != 20 || p[0].Reason != "gave up" {
		t.Errorf("parked for %+v", p)
	}
	if d.replay == nil || d.replay.FromSeq != 11 || d.replay.Position != 14 || d.replay.FinishedAt != nil {
		t.Errorf("replay %+v, want the unfinished run from 11 at 14", d.replay)
	}
	if len(d.moved) != 1 || d.moved[0].Queue != "q1" || d.moved[0].Count != 2 || !d.moved[0].Last.After(d.moved[0].First) {
		t.Errorf("moved %+v, want q1's two moves of the last minute", d.moved)
	}
	if d.pace != nil {
		t.Errorf("a replay read once has a pace: %+v", d.pace)
	}
	if _, err := pool.Exec(ctx, `UPDATE `+table.Side("replay")+` SET position = 18 WHERE finished_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	if d, err = load(ctx); err != nil || d.pace == nil || d.pace.perSecond <= 0 {
		t.Errorf("a replay that moved by 4 since the last read: pace %+v, %v", d.pace, err)
	}

	// The replay's and the backfill's errors are both kept.
	if _, err := pool.Exec(ctx, `DROP TABLE `+table.Side("replay")+`, `+table.Side("backfilled")); err != nil {
		t.Fatal(err)
	}
	if d, err = load(ctx); err != nil {
		t.Fatal(err)
	}
	if msg := fmt.Sprint(d.errs["runs"]); !strings.Contains(msg, "read the replay record") || !strings.Contains(msg, "read the backfill's moves") {
		t.Errorf("the runs' error %q, want the replay's and the backfill's", msg)
	}
}
