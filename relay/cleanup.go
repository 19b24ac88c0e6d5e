package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/errlog"
	"github.com/relayd/relayd/internal/outboxsql"
)

// cleanup runs CleanupOnce every CleanupInterval.
func (r *Relay) cleanup(ctx context.Context) {
	errs := errlog.New(r.log, "cleanup")
	t := time.NewTicker(r.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.CleanupOnce(ctx); err != nil && ctx.Err() == nil {
			errs.Error(err)
		} else {
			errs.OK()
		}
	}
}

// CleanupOnce finishes the next slice of stranded rows (rows JetStream has
// that RabbitMQ owed before the move to nats only), then deletes, 1000 at a
// time, the record of delivered ids and the backfill's record of moved ids
// past retention; it returns the first error.
func (r *Relay) CleanupOnce(ctx context.Context) error {
	// Each step on its own: one that fails does not keep the others from
	// their work.
	first := r.finishStranded(ctx)
	for i, q := range []string{r.store.sql.CleanupDelivered, r.store.sql.CleanupBackfilled} {
		from := &r.trimmed[i]
		for {
			if err := ctx.Err(); err != nil {
				return err
			}
			var n int64
			var newest *time.Time
			p := outboxsql.CleanupParams{RetentionMS: r.cfg.Retention.Milliseconds(), Limit: 1000, From: from.Add(-trimMargin)}
			err := r.pool.QueryRow(ctx, q, pgx.StrictStructArgs(p)).Scan(&n, &newest)
			if err != nil {
				first = cmp.Or(first, fmt.Errorf("cleanup: %w", err))
				break
			}
			if newest != nil && newest.After(*from) {
				*from = *newest
			}
			if n < 1000 {
				break
			}
		}
	}
	return first
}

// trimMargin is how far before the newest row the last pass deleted the
// next one starts: a row recorded meanwhile with an earlier time (its batch
// committed later) is at most a batch's lease older.
const trimMargin = 10 * time.Minute

// strandedCursor is where finishStranded's next slice of stranded rows starts.
// mu keeps two CleanupOnce calls from walking the same slice.
type strandedCursor struct {
	mu    sync.Mutex
	from  int64 // finishStranded moves it to the last id it read; the next slice starts past it
	slice int   // how many rows a slice finishes at most; tests make it small
}

// strandedSliceRows is how many stranded rows each finishStranded finishes at most.
const strandedSliceRows = 50000

// finishStranded moves out of the owed table, in the nats-only phase, rows
// JetStream has that RabbitMQ owed before the move, which no batch claims:
// the next slice of them each call, by an index that holds only them
// (docs/design.md, "Stranded rows"). It runs wholly before or after a change
// of the table's phase; while one is being made it leaves the slice to the
// next call.
func (r *Relay) finishStranded(ctx context.Context) error {
	if !r.phase.now().NATSOnly() {
		return nil
	}
	s := &r.stranded
	s.mu.Lock()
	defer s.mu.Unlock()
	var last, scanned, n int64
	// Read committed, whatever the database's default: Finish's snapshot
	// is its own statement's.
	err := pgx.BeginTxFunc(ctx, r.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		// A planner that costs the owed table's heap for the whole id range
		// would read it all rather than the stranded rows' index.
		if _, err := tx.Exec(ctx, outboxsql.OnIndexes); err != nil {
			return err
		}
		var free bool
		if err := tx.QueryRow(ctx, r.store.sql.PhaseShare).Scan(&free); err != nil || !free {
			return cmp.Or(err, errPhaseChanging)
		}
		r.hooks.onFinishing()
		return tx.QueryRow(ctx, r.store.sql.Finish, pgx.StrictStructArgs(outboxsql.FinishParams{After: s.from, Limit: s.slice})).
			Scan(&last, &scanned, &n)
	})
	if errors.Is(err, errPhaseChanging) {
		r.log.Debug("cleanup: a change of the phase is being recorded: stranded rows wait for the next pass")
		return nil
	}
	if err != nil {
		return fmt.Errorf("cleanup: finish rows JetStream has: %w", err)
	}
	s.from = last
	if scanned < int64(s.slice) {
		s.from = 0 // the end: from the start next time
	}
	if n > 0 {
		r.log.Info("finished rows JetStream has that RabbitMQ owed before the move to nats only", "rows", n)
	}
	return nil
}

// errPhaseChanging: a change of the table's phase holds its lock.
var errPhaseChanging = errors.New("a change of the phase holds its lock")
