package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/relayd/relayd/backfill"
	"github.com/relayd/relayd/internal/replay"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// The console reads nothing in the background. Its figures are those the
// /metrics polls read every RELAY_STATS_INTERVAL: the stats teed into
// consoleFigures, the Postgres health as metrics.Postgres keeps it; what
// only the page shows is read when a viewer asks, at most once per interval
// for every viewer together (sharedRead).

// lagWindow is how much lag history the console keeps, and charts.
const lagWindow = 15 * time.Minute

// lagSamplesMax bounds the lag history: samples closer together than
// lagWindow/lagSamplesMax are not kept.
const lagSamplesMax = 450

// lagSample is the targets' lag at one stats read; has[i] is false for a
// target of relay.Targets the read did not cover.
type lagSample struct {
	at  time.Time
	lag [2]time.Duration
	has [2]bool
}

// consoleFigures holds what the stats poll read last, and the lag history.
// Written by the poll's goroutine (tee), read by the page handlers
// (snapshot).
type consoleFigures struct {
	now func() time.Time

	mu      sync.Mutex
	stats   []relay.TargetStats
	statsAt time.Time   // zero until the first read
	lags    []lagSample // oldest first, within lagWindow
}

func newConsoleFigures(now func() time.Time) *consoleFigures {
	return &consoleFigures{now: now}
}

// teeStats returns read, also keeping what it reads successfully.
func (f *consoleFigures) teeStats(read func(context.Context) ([]relay.TargetStats, error)) func(context.Context) ([]relay.TargetStats, error) {
	return func(ctx context.Context) ([]relay.TargetStats, error) {
		s, err := read(ctx)
		if err == nil {
			f.setStats(s)
		}
		return s, err
	}
}

func (f *consoleFigures) setStats(s []relay.TargetStats) {
	at := f.now()
	sample := lagSample{at: at}
	for _, ts := range s {
		if i := slices.Index(relay.Targets, ts.Target); i >= 0 {
			sample.lag[i], sample.has[i] = ts.Lag, true
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stats, f.statsAt = slices.Clone(s), at
	if n := len(f.lags); n > 0 && at.Sub(f.lags[n-1].at) < lagWindow/lagSamplesMax {
		return
	}
	drop := 0
	for drop < len(f.lags) && at.Sub(f.lags[drop].at) > lagWindow {
		drop++
	}
	f.lags = append(f.lags[drop:], sample)
}

// figuresSnapshot is consoleFigures at one moment, for one page.
type figuresSnapshot struct {
	stats   []relay.TargetStats
	statsAt time.Time
	lags    []lagSample
}

func (f *consoleFigures) snapshot() figuresSnapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return figuresSnapshot{stats: f.stats, statsAt: f.statsAt, lags: slices.Clone(f.lags)}
}

// pageData is what only the page reads from Postgres. A part that could not
// be read has its error in errs, by section, and is empty.
type pageData struct {
	phase  phaseState
	parked []relay.ParkedRow
	replay *replay.Record // the latest run; nil when none was ever recorded
	pace   *replayPace    // the unfinished replay run's, since the last read; nil with one read yet
	moved  []backfill.Moved
	readAt time.Time
	errs   map[string]error
}

// parkedShown is how many parked rows the page lists: the highest ids, the
// rows written last, through the parked index on id.
const parkedShown = 50

// backfillWindow is how far back the page looks for a backfill's moves.
const backfillWindow = time.Minute

// pageLoader reads pageData from the outbox's tables.
func pageLoader(pool *pgxpool.Pool, table schema.Table, now func() time.Time) func(context.Context) (pageData, error) {
	var paces replayPaces
	return func(ctx context.Context) (pageData, error) {
		d := pageData{readAt: now(), errs: map[string]error{}}
		var err error
		if d.phase, err = readPhaseState(ctx, pool, table, true); err != nil {
			d.errs["phase"] = err
		}
		if d.parked, err = relay.ListParkedLast(ctx, pool, table, relay.Targets, parkedShown); err != nil {
			d.errs["parked"] = err
		}
		run, ok, replayErr := replay.Latest(ctx, pool, table)
		if ok && replayErr == nil {
			d.replay = &run
			d.pace = paces.observe(run, d.readAt)
		}
		d.moved, err = backfill.RecentlyMoved(ctx, pool, table, backfillWindow)
		if err := errors.Join(replayErr, err); err != nil {
			d.errs["runs"] = err
		}
		return d, nil
	}
}

// replayPace is how fast a replay run went between two page reads.
type replayPace struct {
	perSecond float64
	over      time.Duration // between the two reads
}

// replayPaces keeps the replay run's position at the last page read, to
// measure its pace at the next: an average since its start would count the
// time a resumed run was stopped. Safe for concurrent use.
type replayPaces struct {
	mu  sync.Mutex
	id  int64
	pos uint64
	at  time.Time // zero before the first read
}

// observe keeps r's position read at at, and returns its pace since the
// read before: nil for a finished run, another run, or the first read.
func (p *replayPaces) observe(r replay.Record, at time.Time) *replayPace {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.at.IsZero() && !at.After(p.at) { // a read that began earlier ended later
		return nil
	}
	id, pos, since := p.id, p.pos, p.at
	p.id, p.pos, p.at = r.ID, r.Position, at
	if since.IsZero() || r.FinishedAt != nil || r.ID != id || r.Position < pos {
		return nil
	}
	over := at.Sub(since)
	return &replayPace{perSecond: float64(r.Position-pos) / over.Seconds(), over: over}
}

// sharedRead is a read shared by every viewer: while one runs, others ask
// for its result (a single flight), and its result, an error too, serves
// every request until it is ttl old. A load runs for the requests waiting
// on it: when the last has gone, it is cancelled, and its result dropped.
// Safe for concurrent use.
type sharedRead[T any] struct {
	ttl  time.Duration
	now  func() time.Time
	load func(context.Context) (T, error)
	// timeout bounds a load.
	timeout time.Duration
	// joined, when set, is called as a request begins to wait for the load
	// in flight. A test hook: nil in production.
	joined func()

	mu     sync.Mutex
	last   *flight[T] // the last load that ended and was kept; nil before
	flight *flight[T] // the load in flight, nil when none runs
}

// flight is one load. done is closed when it ends; val, err and at are set
// before, and not written after.
type flight[T any] struct {
	done    chan struct{}
	cancel  context.CancelFunc
	waiters int // the requests waiting on it, guarded by sharedRead.mu
	val     T
	err     error
	at      time.Time // when it ended
}

// get returns the last result while it is fresh, or waits for the load in
// flight, or starts one and waits; at is when that result's load ended.
// It returns ctx's error when ctx ends first.
func (s *sharedRead[T]) get(ctx context.Context) (v T, at time.Time, err error) {
	s.mu.Lock()
	if l := s.last; l != nil && s.now().Sub(l.at) < s.ttl {
		s.mu.Unlock()
		return l.val, l.at, l.err
	}
	f, joined := s.flight, s.flight != nil
	if !joined {
		f = &flight[T]{done: make(chan struct{})}
		var lctx context.Context
		lctx, f.cancel = context.WithTimeout(context.WithoutCancel(ctx), s.timeout)
		s.flight = f
		go s.run(lctx, f)
	}
	f.waiters++
	s.mu.Unlock()
	if joined && s.joined != nil {
		s.joined()
	}

	select {
	case <-f.done:
		return f.val, f.at, f.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f.waiters--; f.waiters == 0 && s.flight == f {
		// Nobody waits for it: a later request starts afresh.
		s.flight = nil
		f.cancel()
	}
	var zero T
	return zero, time.Time{}, ctx.Err()
}

// run loads for f, and keeps its result unless f was abandoned. A load that
// panics ends f with an error.
func (s *sharedRead[T]) run(ctx context.Context, f *flight[T]) {
	defer func() {
		if p := recover(); p != nil {
			var zero T
			f.val, f.err = zero, fmt.Errorf("the read panicked: %v", p)
		}
		f.cancel()
		s.mu.Lock()
		defer s.mu.Unlock()
		f.at = s.now()
		if s.flight == f {
			s.flight, s.last = nil, f
		}
		close(f.done)
	}()
	f.val, f.err = s.load(ctx)
}
