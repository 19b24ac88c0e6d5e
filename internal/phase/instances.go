package phase

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/schema"
)

// Instance is a running relay's report of itself.
type Instance struct {
	Instance  string    `json:"instance"` // host:pid
	Phase     Name      `json:"phase"`    // the phase it runs
	Pinned    bool      `json:"pinned"`   // RELAY_TARGETS pins it: it does not follow the table
	Version   string    `json:"version"`
	StartedAt time.Time `json:"started_at"`
	SeenAt    time.Time `json:"seen_at"`
	// Age is how long ago it last reported, by the database's clock.
	Age time.Duration `json:"-"`
}

// BeatEvery is how often a relay reports itself; Seen is how recently it
// must have for the others to count it as running.
const (
	BeatEvery = 2 * time.Second
	Seen      = 5 * BeatEvery
	// ForgetAfter is when a relay that stopped reporting (killed) is
	// deleted from the table; PruneEvery how often a relay deletes them.
	ForgetAfter = 24 * time.Hour
	PruneEvery  = time.Hour
)

// Beat writes in's report.
func Beat(ctx context.Context, db *pgxpool.Pool, table schema.Table, in Instance) error {
	_, err := db.Exec(ctx, outboxsql.For(table).InstanceBeat, pgx.StrictStructArgs(outboxsql.InstanceBeatParams{
		Instance: in.Instance, Phase: string(in.Phase), Pinned: in.Pinned, Version: in.Version, StartedAt: in.StartedAt,
	}))
	if err != nil {
		return fmt.Errorf("report this relay in %s: %w", table.Side("instances"), err)
	}
	return nil
}

// Prune forgets the relays silent for ForgetAfter. It reads the whole
// table, every version of each relay's report a held horizon keeps: run
// it every PruneEvery, not at every beat.
func Prune(ctx context.Context, db *pgxpool.Pool, table schema.Table) error {
	_, err := db.Exec(ctx, outboxsql.For(table).InstancesPrune, pgx.StrictStructArgs(outboxsql.InstancesPruneParams{ForgetAfterMS: ForgetAfter.Milliseconds()}))
	if err != nil {
		return fmt.Errorf("forget the relays silent for %s in %s: %w", ForgetAfter, table.Side("instances"), err)
	}
	return nil
}

// Leave removes a stopping relay's report.
func Leave(ctx context.Context, db *pgxpool.Pool, table schema.Table, instance string) error {
	_, err := db.Exec(ctx, outboxsql.For(table).InstanceLeave, pgx.StrictStructArgs(outboxsql.InstanceLeaveParams{Instance: instance}))
	return err
}

// Running returns the relays that reported within Seen.
func Running(ctx context.Context, db *pgxpool.Pool, table schema.Table) ([]Instance, error) {
	rows, err := db.Query(ctx, outboxsql.For(table).Instances, pgx.StrictStructArgs(outboxsql.InstancesParams{SeenMS: Seen.Milliseconds()}))
	if err != nil {
		return nil, fmt.Errorf("read the running relays: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Instance, error) {
		var in Instance
		var age float64
		err := r.Scan(&in.Instance, &in.Phase, &in.Pinned, &in.Version, &in.StartedAt, &in.SeenAt, &age)
		in.Age = time.Duration(age * float64(time.Second))
		return in, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the running relays: %w", err)
	}
	return out, nil
}

// Astray returns the running relays whose phase is not want.
func Astray(in []Instance, want Name) []Instance {
	var out []Instance
	for _, i := range in {
		if i.Phase != want {
			out = append(out, i)
		}
	}
	return out
}
