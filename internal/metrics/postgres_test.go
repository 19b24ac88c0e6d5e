package metrics

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/relayd/relayd/internal/pghealth"
)

// The horizon's holders: an age Postgres gives is exported as it is; one it
// does not (a slot) counts from the first read that saw that holder at that
// horizon, and again from zero at another horizon. A holder is named only
// once it has held the horizon for HolderInfoAfter.
func TestPostgresGauges(t *testing.T) {
	reg := prometheus.NewRegistry()
	p := NewPostgres(reg)
	now := time.Unix(1_800_000_000, 0)
	p.now = func() time.Time { return now }
	read := func(slotHorizon string) pghealth.Health {
		return pghealth.Health{
			Horizon: []pghealth.Holder{
				{Kind: "transaction", PID: 42, Name: "psql", State: "idle in transaction", Horizon: "900", XIDs: 300, Age: 90 * time.Second, AgeKnown: true},
				{Kind: "replication slot", Name: "standby_1", State: "inactive", Horizon: slotHorizon, XIDs: 100},
			},
			Tables: []pghealth.Table{{Table: "outbox", DeadTuples: 200903, LiveTuples: 12, Bytes: 203 << 20}},
		}
	}
	for _, step := range []struct {
		after   time.Duration
		horizon string // the slot's
		want    string
	}{
		{0, "1000", `
relayd_postgres_horizon_age_seconds{kind="replication slot"} 0
relayd_postgres_horizon_age_seconds{kind="transaction"} 90
relayd_postgres_horizon_holder_info{kind="transaction",name="psql",pid="42",state="idle in transaction"} 1
`},
		{70 * time.Second, "1000", `
relayd_postgres_horizon_age_seconds{kind="replication slot"} 70
relayd_postgres_horizon_age_seconds{kind="transaction"} 90
relayd_postgres_horizon_holder_info{kind="replication slot",name="standby_1",pid="0",state="inactive"} 1
relayd_postgres_horizon_holder_info{kind="transaction",name="psql",pid="42",state="idle in transaction"} 1
`},
		{10 * time.Second, "1005", `
relayd_postgres_horizon_age_seconds{kind="replication slot"} 0
relayd_postgres_horizon_age_seconds{kind="transaction"} 90
relayd_postgres_horizon_holder_info{kind="transaction",name="psql",pid="42",state="idle in transaction"} 1
`},
	} {
		now = now.Add(step.after)
		p.Set(read(step.horizon))
		want := `
# HELP relayd_postgres_horizon_age_seconds How long the oldest holder of VACUUM's horizon of each kind has run (transaction, snapshot, standby, prepared, replication slot); from when relayd first saw it where Postgres does not say.
# TYPE relayd_postgres_horizon_age_seconds gauge
# HELP relayd_postgres_horizon_holder_info 1 for each kind's oldest holder of the horizon, once it has held it for a minute: its pid (0: not a session), name (application_name, gid or slot) and state.
# TYPE relayd_postgres_horizon_holder_info gauge
` + strings.TrimPrefix(step.want, "\n")
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "relayd_postgres_horizon_age_seconds", "relayd_postgres_horizon_holder_info"); err != nil {
			t.Errorf("%v later, slot at %s: %v", step.after, step.horizon, err)
		}
	}
	want := `
# HELP relayd_postgres_dead_tuples Row versions of relayd's table (outbox, owed, delivered) that VACUUM has not removed yet (the statistics collector's estimate).
# TYPE relayd_postgres_dead_tuples gauge
relayd_postgres_dead_tuples{table="outbox"} 200903
# HELP relayd_postgres_table_bytes Size of relayd's table (outbox, owed, delivered) on disk, with its indexes and TOAST.
# TYPE relayd_postgres_table_bytes gauge
relayd_postgres_table_bytes{table="outbox"} 2.12860928e+08
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "relayd_postgres_dead_tuples", "relayd_postgres_table_bytes"); err != nil {
		t.Error(err)
	}
}

// Last is the last Set's figures with the ages Set worked out, as a copy.
func TestPostgresLast(t *testing.T) {
	p := NewPostgres(prometheus.NewRegistry())
	now := time.Unix(1_800_000_000, 0)
	p.now = func() time.Time { return now }
	if _, at := p.Last(); !at.IsZero() {
		t.Errorf("before any Set: read at %v, want zero", at)
	}
	slot := pghealth.Health{Horizon: []pghealth.Holder{{Kind: "replication slot", Name: "standby_1", Horizon: "1000"}}}
	for range 2 {
		h := slot
		h.Horizon = append([]pghealth.Holder(nil), slot.Horizon...)
		p.Set(h)
		now = now.Add(70 * time.Second)
	}
	h, at := p.Last()
	if want := now.Add(-70 * time.Second); !at.Equal(want) || h.Horizon[0].Age != 70*time.Second {
		t.Errorf("Last = age %s at %v, want 1m10s at %v", h.Horizon[0].Age, at, want)
	}
	h.Horizon[0].Age = 0
	if again, _ := p.Last(); again.Horizon[0].Age != 70*time.Second {
		t.Error("Last shares its slices with the metrics")
	}
}
