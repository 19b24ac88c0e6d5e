package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/backoff"
)

// Horizon is one run of the long-transaction soak (-only horizon): one
// relayd, dual write, while producers commit single rows at Rate; after a
// warm-up window and a baseline one a transaction of Kind holds VACUUM's
// horizon for HoldSeconds, then ends, and a window more is measured.
type Horizon struct {
	Kind        string          `json:"kind"`
	Rate        int             `json:"rate"`
	HoldSeconds float64         `json:"hold_seconds"`
	Windows     []HorizonWindow `json:"windows"`
	// The outbox's size with its indexes: before the hold, at its end, and
	// after a VACUUM once it ended; and its dead rows at the end.
	BytesBefore      int64 `json:"bytes_before"`
	BytesHoldEnd     int64 `json:"bytes_hold_end"`
	BytesAfterVacuum int64 `json:"bytes_after_vacuum"`
	DeadAtHoldEnd    int64 `json:"dead_rows_hold_end"`
	// HeldRowMs: the held producer transaction's row, its commit to both
	// brokers (0: the kind holds no row).
	HeldRowMs      float64 `json:"held_row_ms,omitempty"`
	HeldRowMissing bool    `json:"held_row_missing,omitempty"` // it never reached both
	// The p99 of the baseline window and of the hold's last one.
	BaselineP99Ms float64 `json:"baseline_p99_ms"`
	LastHoldP99Ms float64 `json:"last_hold_p99_ms"`
}

// HorizonWindow is one window of a run: latency of the rows committed in
// it, and core-seconds, WAL flushes and notifications per 10k of them.
type HorizonWindow struct {
	StartSeconds float64 `json:"start_seconds"`
	Phase        string  `json:"phase"` // warm-up, baseline, hold, after
	Rows         int     `json:"rows"`
	P50Ms        float64 `json:"p50_ms"`
	P99Ms        float64 `json:"p99_ms"`
	RelaydCPU    float64 `json:"relayd_cpu_per_10k"`
	PostgresCPU  float64 `json:"postgres_cpu_per_10k"`
	// Per 10k rows: the cluster's WAL flushes, and the producers'
	// notifications (each a commit serialised on the notify lock).
	WALFlushes    float64 `json:"wal_flushes_per_10k"`
	Notifications float64 `json:"notifications_per_10k"`
	DeadRows      int64   `json:"dead_rows_at_end"`
}

// horizonKinds are what the soak holds open: a producer's transaction that
// inserted a row, and a read-only REPEATABLE READ snapshot (pg_dump's).
var horizonKinds = []string{"producer transaction", "repeatable read snapshot"}

func (b *bench) horizons(ctx context.Context, res *Results) error {
	for _, kind := range horizonKinds {
		b.logf("horizon: %s held %v at %s rows/s, windows of %v", kind, b.o.HorizonHold, thousands(float64(b.o.HorizonRate)), b.o.HorizonWindow)
		h, err := b.horizon(ctx, kind)
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		for _, w := range h.Windows {
			b.logf("  %6.0fs %-8s %s rows, p50 %6.1f ms, p99 %6.1f ms; relayd %.2f, Postgres %.2f core-s/10k rows; %.0f WAL flushes, %.0f notifications /10k rows; %s dead rows",
				w.StartSeconds, w.Phase, thousands(float64(w.Rows)), w.P50Ms, w.P99Ms, w.RelaydCPU, w.PostgresCPU, w.WALFlushes, w.Notifications, thousands(float64(w.DeadRows)))
		}
		res.Horizon = append(res.Horizon, h)
		b.settle(ctx)
	}
	return nil
}

func (b *bench) horizon(ctx context.Context, kind string) (h Horizon, err error) {
	h = Horizon{Kind: kind, Rate: b.o.HorizonRate, HoldSeconds: b.o.HorizonHold.Seconds()}
	cr, err := b.newCorner(ctx, cornerSpec{table: true, stream: true, amqp: true})
	if err != nil {
		return h, err
	}
	defer cr.close()
	b.checkpoint(ctx)
	// The warm-up keeps the relay's start and the producers' first
	// connections out of the baseline the hold is held against.
	window, hold := b.o.HorizonWindow, b.o.HorizonHold
	warm := window
	total := warm + window + hold + window
	rec := &recorder{t0: time.Now(), m: make(map[string]*latencyRec, b.o.HorizonRate*int(total/time.Second+1))}
	stopConsumers, err := b.latencyConsumers(ctx, cr, rec)
	if err != nil {
		return h, err
	}
	defer stopConsumers()
	p, err := b.start(cr.relaydEnv("amqp,nats"), "run")
	if err != nil {
		return h, err
	}
	defer p.kill()
	if err := p.waitStarted(ctx); err != nil {
		return h, err
	}
	if err := b.openProducerConns(ctx, latencyProducers); err != nil {
		return h, err
	}
	notified, err := b.countNotifications(ctx, cr.table.Channel())
	if err != nil {
		return h, fmt.Errorf("listen: %w", err)
	}
	defer notified.close()
	outbox := cr.table.Ident()
	read := func(q string) (n int64) {
		b.pool.QueryRow(ctx, q, outbox).Scan(&n) //nolint:errcheck // 0 if it failed: a figure, not the run
		return n
	}
	size := func() int64 { return read(`SELECT pg_total_relation_size($1::regclass)`) }
	dead := func() int64 { return read(`SELECT n_dead_tup FROM pg_stat_user_tables WHERE relid = $1::regclass`) }
	h.BytesBefore = size()

	tt := timetable{rate: b.o.HorizonRate, rows: 1, total: int(float64(b.o.HorizonRate) * total.Seconds())}
	produced := make(chan error, 1)
	go func() { _, err := b.produce(ctx, cr, rec, tt, latencyProducers); produced <- err }()

	type edge struct {
		at                   time.Duration // since rec.t0
		cpu                  cpuSnap
		dead                 int64
		walFlushes, notified int64
	}
	edges := []edge{{at: time.Since(rec.t0), cpu: takeCPUSnap(), walFlushes: walFlushes(ctx, b.pool), notified: notified.count()}}
	phaseAt := func(at time.Duration) string {
		switch {
		case at < edges[0].at+warm:
			return "warm-up"
		case at < edges[0].at+warm+window:
			return "baseline"
		case at < edges[0].at+warm+window+hold:
			return "hold"
		}
		return "after"
	}
	var held pgx.Tx
	defer func() {
		if held != nil {
			held.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the run failed
		}
	}()
	var heldID string
	var heldCommit time.Duration
	for next := edges[0].at + warm; next <= edges[0].at+total; next += window {
		if !backoff.Sleep(ctx, next-time.Since(rec.t0)) {
			return h, ctx.Err()
		}
		edges = append(edges, edge{at: time.Since(rec.t0), cpu: takeCPUSnap(), dead: dead(), walFlushes: walFlushes(ctx, b.pool), notified: notified.count()})
		switch phaseAt(next) {
		case "hold":
			if held == nil {
				if held, heldID, err = b.holdHorizon(ctx, kind, outbox); err != nil {
					return h, err
				}
			}
		case "after":
			if held != nil {
				h.BytesHoldEnd, h.DeadAtHoldEnd = size(), dead()
				if err := held.Commit(ctx); err != nil {
					return h, fmt.Errorf("end the hold: %w", err)
				}
				held, heldCommit = nil, time.Since(rec.t0)
			}
		}
	}
	if err := <-produced; err != nil {
		return h, err
	}
	if err := b.awaitStragglers(ctx, p, rec, 0); err != nil {
		return h, err
	}
	if _, err := p.stop(); err != nil {
		return h, err
	}
	if _, err := b.pool.Exec(ctx, `VACUUM `+outbox); err != nil {
		return h, fmt.Errorf("vacuum: %w", err)
	}
	h.BytesAfterVacuum = size()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	for i := 0; i+1 < len(edges); i++ {
		lo, hi := edges[i].at, edges[i+1].at
		var lat []time.Duration
		for _, r := range rec.m {
			if c := time.Duration(r.commit); r.slot >= 0 && c >= lo && c < hi && r.natsAt > 0 && r.amqpAt > 0 {
				lat = append(lat, max(0, time.Duration(max(r.natsAt, r.amqpAt)-r.commit)))
			}
		}
		w := HorizonWindow{StartSeconds: round((lo - edges[0].at).Seconds(), 0), Phase: phaseAt(lo), Rows: len(lat), DeadRows: edges[i+1].dead}
		if len(lat) > 0 {
			slices.Sort(lat)
			w.P50Ms, w.P99Ms = msOf(pct(lat, 50)), msOf(pct(lat, 99))
			if s := cpuSplit(edges[i].cpu, edges[i+1].cpu, len(lat), p); s != nil {
				w.RelaydCPU, w.PostgresCPU = s.Relayd, s.Postgres
			}
			per10k := 1e4 / float64(len(lat))
			w.WALFlushes = round(float64(edges[i+1].walFlushes-edges[i].walFlushes)*per10k, 0)
			w.Notifications = round(float64(edges[i+1].notified-edges[i].notified)*per10k, 0)
		}
		h.Windows = append(h.Windows, w)
		switch w.Phase {
		case "baseline":
			h.BaselineP99Ms = w.P99Ms
		case "hold":
			h.LastHoldP99Ms = w.P99Ms
		}
	}
	if heldID != "" {
		if r := rec.m[heldID]; r != nil && r.natsAt > 0 && r.amqpAt > 0 {
			h.HeldRowMs = msOf(time.Duration(max(r.natsAt, r.amqpAt)) - heldCommit)
		} else {
			h.HeldRowMissing = true
		}
	}
	return h, nil
}

// holdHorizon begins the transaction that holds the horizon: a producer's
// that inserted a row (its message id returned), or a read-only
// REPEATABLE READ snapshot.
func (b *bench) holdHorizon(ctx context.Context, kind, outbox string) (pgx.Tx, string, error) {
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		return nil, "", err
	}
	var id string
	switch kind {
	case "producer transaction":
		err = tx.QueryRow(ctx, `INSERT INTO `+outbox+` (topic, payload) VALUES ($1, $2) RETURNING message_id::text`, topic, b.payload).Scan(&id)
	default:
		if _, err = tx.Exec(ctx, `SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY`); err == nil {
			_, err = tx.Exec(ctx, `SELECT count(*) FROM `+outbox)
		}
	}
	if err != nil {
		tx.Rollback(ctx) //nolint:errcheck // failed anyway
		return nil, "", fmt.Errorf("hold the horizon: %w", err)
	}
	return tx, id, nil
}

// writeHorizons prints each soak's windows.
func writeHorizons(w io.Writer, r *Results) {
	for _, h := range r.Horizon {
		fmt.Fprintf(w, "**%s held %s** at %s rows/s: the outbox %s before, %s at the hold's end (%s dead rows), %s after VACUUM",
			h.Kind, (time.Duration(h.HoldSeconds) * time.Second).String(), thousands(float64(h.Rate)),
			mibText(h.BytesBefore), mibText(h.BytesHoldEnd), thousands(float64(h.DeadAtHoldEnd)), mibText(h.BytesAfterVacuum))
		if h.HeldRowMs > 0 {
			fmt.Fprintf(w, "; the held row reached both brokers %.0f ms after its commit", h.HeldRowMs)
		}
		fmt.Fprintf(w, "\n\n| from | phase | rows | p50 ms | p99 ms | relayd core-s/10k | Postgres core-s/10k | WAL flushes/10k | notifications/10k | dead rows |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, x := range h.Windows {
			fmt.Fprintf(w, "| %.0f s | %s | %s | %.1f | %.1f | %.2f | %.2f | %.0f | %.0f | %s |\n",
				x.StartSeconds, x.Phase, thousands(float64(x.Rows)), x.P50Ms, x.P99Ms, x.RelaydCPU, x.PostgresCPU, x.WALFlushes, x.Notifications, thousands(float64(x.DeadRows)))
		}
		fmt.Fprintln(w)
	}
}

// mibText is a table's size in MiB: size's KiB would run to six figures.
func mibText(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }
