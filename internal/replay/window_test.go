package replay

import (
	"errors"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/phase"
)

func TestPlan(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	hist := func(phases ...phase.Name) []phase.Change {
		var h []phase.Change
		for i, p := range phases {
			h = append(h, phase.Change{Phase: p, ChangedAt: at(10 * i)})
		}
		return h
	}
	since := at(-100)
	for _, tc := range []struct {
		name    string
		req     Request
		history []phase.Change
		want    Window
		wantErr error
	}{
		{"no history, no flags", Request{}, nil, Window{}, ErrNoPeriod},
		{"never nats", Request{}, hist(phase.AMQP, phase.Dual, phase.AMQP), Window{}, ErrNoPeriod},
		{"ended period: its bounds widened by the margin", Request{}, hist(phase.AMQP, phase.Dual, phase.NATS, phase.Dual),
			Window{Source: "phase", Start: at(20).Add(-Margin), End: at(30).Add(Margin)}, nil},
		{"ongoing period: to the stream's end", Request{}, hist(phase.Dual, phase.NATS),
			Window{Source: "phase", Start: at(10).Add(-Margin), Ongoing: true}, nil},
		{"the latest of two periods", Request{}, hist(phase.NATS, phase.Dual, phase.NATS, phase.AMQP),
			Window{Source: "phase", Start: at(20).Add(-Margin), End: at(30).Add(Margin)}, nil},
		{"a period set twice starts at the first", Request{}, hist(phase.Dual, phase.NATS, phase.NATS, phase.Dual),
			Window{Source: "phase", Start: at(10).Add(-Margin), End: at(30).Add(Margin)}, nil},
		{"--to-seq ends a period's window", Request{ToSeq: 900}, hist(phase.Dual, phase.NATS, phase.Dual),
			Window{Source: "phase", Start: at(10).Add(-Margin), ToSeq: 900}, nil},
		{"--since overrides the history", Request{Since: since}, hist(phase.Dual, phase.NATS, phase.Dual),
			Window{Source: "since", Start: since}, nil},
		{"--since without history", Request{Since: since}, nil, Window{Source: "since", Start: since}, nil},
		{"--from-seq and --to-seq", Request{FromSeq: 10, ToSeq: 20}, nil, Window{Source: "seq", FromSeq: 10, ToSeq: 20}, nil},
		{"--from-seq alone", Request{FromSeq: 10}, hist(phase.NATS), Window{Source: "seq", FromSeq: 10}, nil},
		{"--to-seq without a start or a period", Request{ToSeq: 5}, nil, Window{}, ErrNoPeriod},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plan(tc.req, tc.history, Stranded{})
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Plan error %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("Plan:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// Rows RabbitMQ was owed at the move to nats reached JetStream before the
// period: the default window starts at the earliest of them, less Margin.
// Rows recorded after the period's end (a batch claimed in it) move its end
// to the latest of them, plus Margin.
func TestPlanStranded(t *testing.T) {
	t0 := time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC)
	at := func(m int) time.Time { return t0.Add(time.Duration(m) * time.Minute) }
	ended := []phase.Change{{Phase: phase.Dual, ChangedAt: at(0)}, {Phase: phase.NATS, ChangedAt: at(60)}, {Phase: phase.Dual, ChangedAt: at(90)}}
	inPeriod := at(70)
	for _, tc := range []struct {
		name     string
		req      Request
		stranded Stranded
		want     Window
	}{
		{"none", Request{}, Stranded{}, Window{Source: "phase", Start: at(59), End: at(91)}},
		{"long before the period: the start moves to it", Request{}, Stranded{at(15), inPeriod}, Window{Source: "phase", Start: at(14), End: at(91)}},
		{"after the period's start: its start stays", Request{}, Stranded{at(60).Add(30 * time.Second), inPeriod}, Window{Source: "phase", Start: at(59), End: at(91)}},
		{"after the period's end: the end moves to it", Request{}, Stranded{at(61), at(95)}, Window{Source: "phase", Start: at(59), End: at(96)}},
		{"both", Request{}, Stranded{at(15), at(95)}, Window{Source: "phase", Start: at(14), End: at(96)}},
		{"with --to-seq", Request{ToSeq: 9}, Stranded{at(15), at(95)}, Window{Source: "phase", Start: at(14), ToSeq: 9}},
		{"--since is the operator's", Request{Since: at(40)}, Stranded{at(15), at(95)}, Window{Source: "since", Start: at(40)}},
		{"--from-seq is the operator's", Request{FromSeq: 3}, Stranded{at(15), at(95)}, Window{Source: "seq", FromSeq: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Plan(tc.req, ended, tc.stranded)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("Plan:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestPlanRefusesContradictions(t *testing.T) {
	for _, req := range []Request{
		{Since: time.Now(), FromSeq: 3},
		{FromSeq: 30, ToSeq: 20},
	} {
		if _, err := Plan(req, nil, Stranded{}); err == nil {
			t.Errorf("Plan(%+v) took it", req)
		}
	}
}

// A rerun compares keys: the same request gives the same key, and
// different windows different ones.
func TestWindowKey(t *testing.T) {
	start := time.Date(2026, 11, 1, 10, 0, 0, 0, time.FixedZone("x", 3600))
	for _, tc := range []struct {
		w    Window
		want string
	}{
		{Window{Source: "phase", Start: start, End: start.Add(time.Hour)}, "phase=2026-11-01T09:00:00Z,until=2026-11-01T10:00:00Z"},
		{Window{Source: "phase", Start: start, Ongoing: true}, "phase=2026-11-01T09:00:00Z"},
		{Window{Source: "since", Start: start}, "since=2026-11-01T09:00:00Z"},
		{Window{Source: "seq", FromSeq: 7, ToSeq: 9}, "from-seq=7,to-seq=9"},
		{Window{Source: "phase", Start: start, ToSeq: 9}, "phase=2026-11-01T09:00:00Z,to-seq=9"},
	} {
		if got := tc.w.Key(); got != tc.want {
			t.Errorf("Key(%+v) = %q, want %q", tc.w, got, tc.want)
		}
	}
}
