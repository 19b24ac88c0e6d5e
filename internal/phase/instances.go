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
	// Age is how long ago it was last seen, by the database's clock: 0 for
	// a relay whose presence session lives.
	Age time.Duration `json:"-"`
}

// BeatEvery is how often a relay looks at its report: it rewrites its row
// when what it reports changed, and checks its presence otherwise. Seen is
// how recently a relay of an earlier version, which rewrote its row at
// every beat, must have for the others to count it as running.
const (
	BeatEvery = 2 * time.Second
	Seen      = 5 * BeatEvery
	// ForgetAfter is when the row of a relay not running (killed) that
	// was last written that long ago is deleted; PruneEvery how often a
	// relay deletes them.
	ForgetAfter = 24 * time.Hour
	PruneEvery  = time.Hour
	// VanishedWithin is how soon Postgres ends the session of a relay
	// whose host vanished (powered off, cut off) by its TCP keepalives and
	// timeout, rather than after the system's 2 h: a killed relay's ends
	// at once.
	VanishedWithin = 15 * time.Second
)

// Presence is a relay's session of its own, which lists the relay as
// running while it lives: a killed relay's ends with its connection, and
// no row is rewritten meanwhile, whose versions a held horizon would keep.
type Presence struct {
	conn  *pgx.Conn
	table schema.Table
}

// presenceSettings end an idle session in 5 + 3 × 2 s of silence, and one
// whose answers go unacknowledged in VanishedWithin.
var presenceSettings = fmt.Sprintf(`SELECT set_config('tcp_keepalives_idle', '5', false),
	set_config('tcp_keepalives_interval', '2', false), set_config('tcp_keepalives_count', '3', false),
	set_config('tcp_user_timeout', '%d', false)`, VanishedWithin.Milliseconds())

// Present takes conn's presence lock; the Presence owns conn from then on.
func Present(ctx context.Context, conn *pgx.Conn, table schema.Table) (*Presence, error) {
	if _, err := conn.Exec(ctx, presenceSettings); err != nil {
		return nil, fmt.Errorf("set this relay's presence session's keepalives: %w", err)
	}
	var ok bool
	if err := conn.QueryRow(ctx, outboxsql.For(table).InstancePresent).Scan(&ok); err != nil {
		return nil, fmt.Errorf("take this relay's presence lock for %s: %w", table.Side("instances"), err)
	}
	if !ok {
		return nil, fmt.Errorf("another session holds this one's presence lock for %s", table.Side("instances"))
	}
	return &Presence{conn: conn, table: table}, nil
}

// Report writes in's report, bound to this session: in runs while it lives.
func (p *Presence) Report(ctx context.Context, in Instance) error {
	_, err := p.conn.Exec(ctx, outboxsql.For(p.table).InstanceBeat, pgx.StrictStructArgs(outboxsql.InstanceBeatParams{
		Instance: in.Instance, Phase: string(in.Phase), Pinned: in.Pinned, Version: in.Version, StartedAt: in.StartedAt,
	}))
	if err != nil {
		return fmt.Errorf("report this relay in %s: %w", p.table.Side("instances"), err)
	}
	return nil
}

// Check reports whether the session still answers: one that does not may
// have ended, and the relay with it, to the others.
func (p *Presence) Check(ctx context.Context) error {
	if err := p.conn.Ping(ctx); err != nil {
		return fmt.Errorf("this relay's presence session: %w", err)
	}
	return nil
}

// Prune, on the session, forgets the relays not running whose rows were last written
// ForgetAfter ago. Under a held horizon it reads every version a row left:
// run it every PruneEvery.
func (p *Presence) Prune(ctx context.Context) error {
	table := p.table
	_, err := p.conn.Exec(ctx, outboxsql.For(table).InstancesPrune, pgx.StrictStructArgs(outboxsql.InstancesPruneParams{ForgetAfterMS: ForgetAfter.Milliseconds()}))
	if err != nil {
		return fmt.Errorf("forget the relays gone for %s in %s: %w", ForgetAfter, table.Side("instances"), err)
	}
	return nil
}

// Leave removes the report of the stopping relay instance.
func (p *Presence) Leave(ctx context.Context, instance string) error {
	_, err := p.conn.Exec(ctx, outboxsql.For(p.table).InstanceLeave, pgx.StrictStructArgs(outboxsql.InstanceLeaveParams{Instance: instance}))
	return err
}

// Running returns the running relays: those whose presence session lives,
// and those of an earlier version that reported within Seen.
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
