package phase

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// Change is one setting of the phase.
type Change struct {
	Phase     Name      `json:"phase"`
	ChangedAt time.Time `json:"changed_at"`
	ChangedBy string    `json:"changed_by"`
	Reason    string    `json:"reason"`
	Forced    bool      `json:"forced,omitempty"`
}

// Read returns the table's phase; ok is false while none was ever set.
func Read(ctx context.Context, db *pgxpool.Pool, table schema.Table) (c Change, ok bool, err error) {
	err = db.QueryRow(ctx, outboxsql.For(table).PhaseRead).Scan(&c.Phase, &c.ChangedAt, &c.ChangedBy, &c.Reason)
	if errors.Is(err, pgx.ErrNoRows) {
		return Change{}, false, nil
	}
	if err != nil {
		return Change{}, false, fmt.Errorf("read the phase of %s: %w", table, err)
	}
	return c, true, nil
}

// ErrChanged: the phase was not the one the change was checked against
// (another change came first).
var ErrChanged = errors.New("the phase changed meanwhile")

// ErrUnchecked: a move to nats neither cleared by a passing cutover check
// nor forced. Nothing is recorded.
var ErrUnchecked = errors.New("a move to nats needs a passing cutover check (cutover.SetPhase), or to be forced")

// Clearance is a passing cutover check, which a move to nats needs unless
// it is forced: phase nats sends rows to JetStream only, and the check says
// no consumer group is left behind on RabbitMQ. cutover.Result is one, and
// cutover.SetPhase runs the check and records the move with its verdict:
// package cutover reads the phase, so phase cannot call it.
type Clearance interface {
	// Clears says whether the check passed for table, every durable
	// consumer of its groups' streams checked.
	Clears(table schema.Table) bool
}

// Set records c as the table's phase, and in its history, unless the
// table's setting now is not from, as Read returned it (with fromSet false:
// unless one was set). It returns the time of the change, by the
// database's clock. A move to nats is refused (ErrUnchecked) unless forced:
// cutover.SetPhase makes one after the cutover check (SetCleared).
func Set(ctx context.Context, db *pgxpool.Pool, table schema.Table, c Change, from Change, fromSet bool) (time.Time, error) {
	return record(ctx, db, table, c, from, fromSet, nil)
}

// SetCleared is Set for a move that cl, a cutover check of table, cleared.
func SetCleared(ctx context.Context, db *pgxpool.Pool, table schema.Table, c Change, from Change, fromSet bool, cl Clearance) (time.Time, error) {
	return record(ctx, db, table, c, from, fromSet, cl)
}

// record is Set and SetCleared: a move to nats needs c.Forced or cl.
func record(ctx context.Context, db *pgxpool.Pool, table schema.Table, c Change, from Change, fromSet bool, cl Clearance) (time.Time, error) {
	if c.Phase == NATS && !c.Forced && (cl == nil || !cl.Clears(table)) {
		return time.Time{}, fmt.Errorf("set the phase of %s: %w", table, ErrUnchecked)
	}
	q := outboxsql.For(table)
	var at time.Time
	err := inTx(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, q.PhaseLock); err != nil {
			return err
		}
		var now Change
		err := tx.QueryRow(ctx, q.PhaseRead).Scan(&now.Phase, &now.ChangedAt, &now.ChangedBy, nil)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			if fromSet {
				return fmt.Errorf("%w: no phase is set", ErrChanged)
			}
		case err != nil:
			return err
		case !fromSet || now.Phase != from.Phase:
			return fmt.Errorf("%w: it is %s now", ErrChanged, now.Phase)
		case !now.ChangedAt.Equal(from.ChangedAt):
			// The same phase set again meanwhile (dual, amqp, dual): the
			// relays ran another phase since the caller's check.
			return fmt.Errorf("%w: it is %s again, set at %s by %s", ErrChanged, now.Phase, now.ChangedAt.UTC().Format(time.RFC3339Nano), now.ChangedBy)
		}
		set := outboxsql.PhaseSetParams{Phase: string(c.Phase), ChangedBy: c.ChangedBy, Reason: c.Reason, Forced: c.Forced}
		return tx.QueryRow(ctx, q.PhaseSet, pgx.StrictStructArgs(set)).Scan(&at)
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("set the phase of %s: %w", table, err)
	}
	return at, nil
}

// ErrUnknown: Set's commit got no answer (the connection or the session
// ended meanwhile): the change may or may not be recorded.
var ErrUnknown = errors.New("no answer from Postgres to the commit")

// inTx runs fn in a transaction and commits it; a commit that fails other
// than by Postgres's own error (the transaction rolled back) is ErrUnknown.
func inTx(ctx context.Context, db *pgxpool.Pool, fn func(pgx.Tx) error) error {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit, a no-op
	if err := fn(tx); err != nil {
		return err
	}
	err = tx.Commit(ctx)
	var pgErr *pgconn.PgError
	if err == nil || errors.Is(err, pgx.ErrTxCommitRollback) || (errors.As(err, &pgErr) && cmp.Or(pgErr.SeverityUnlocalized, pgErr.Severity) == "ERROR") {
		return err
	}
	// A FATAL or a lost connection can come after the commit record was
	// written (a synchronous standby's wait ended by a signal, a failover).
	return fmt.Errorf("%w: %w", ErrUnknown, err)
}

// History returns every change of the table's phase, oldest first.
func History(ctx context.Context, db *pgxpool.Pool, table schema.Table) ([]Change, error) {
	rows, err := db.Query(ctx, outboxsql.For(table).PhaseHistory)
	if err != nil {
		return nil, fmt.Errorf("read the phase history of %s: %w", table, err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Change, error) {
		var c Change
		err := r.Scan(&c.Phase, &c.ChangedAt, &c.ChangedBy, &c.Reason, &c.Forced)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read the phase history of %s: %w", table, err)
	}
	return out, nil
}

// Period is a stretch of time the table spent in one phase; End is zero
// while it lasts.
type Period struct {
	Phase      Name
	Start, End time.Time
}

// LastPeriod returns the latest period in phase n, from a history oldest
// first; ok is false when the table was never in n.
func LastPeriod(history []Change, n Name) (p Period, ok bool) {
	for i := len(history) - 1; i >= 0; i-- {
		if history[i].Phase != n {
			continue
		}
		// The period began at the first of a run of settings of n.
		start := i
		for start > 0 && history[start-1].Phase == n {
			start--
		}
		p = Period{Phase: n, Start: history[start].ChangedAt}
		if i+1 < len(history) {
			p.End = history[i+1].ChangedAt
		}
		return p, true
	}
	return Period{}, false
}

// Source is the table's phase as a relay follows it (relay.PhaseSource).
type Source struct {
	DB    *pgxpool.Pool
	Table schema.Table
}

var _ relay.PhaseSource = Source{}

// Phase implements relay.PhaseSource.
func (s Source) Phase(ctx context.Context) ([]relay.Target, bool, error) {
	c, ok, err := Read(ctx, s.DB, s.Table)
	if !ok || err != nil {
		return nil, false, err
	}
	return c.Phase.Targets(), true, nil
}
