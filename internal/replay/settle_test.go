package replay

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// The recorded position goes only past confirmed or skipped messages with
// nothing unconfirmed before them: a batch confirmed after an unconfirmed
// one is not recorded, so a rerun sends it again rather than lose the one
// before it.
func TestSettleRecordsAContiguousPrefix(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	for _, tc := range []struct {
		name     string
		fail     error // the verdict on sequence 5
		wantErr  error
		wantPos  int64
		wantSent int64
		wantPerm int64
		stops    bool
	}{
		{"all confirmed", nil, nil, 9, 8, 0, false},
		{"returned unroutable: the run fails there", relay.ErrReturned, ErrFailed, 4, 3, 0, true},
		{"nacked: the run fails there", relay.ErrNacked, ErrFailed, 4, 3, 0, true},
		{"unknown when the run stopped", relay.Unavailable(errors.New("connection lost")), nil, 4, 3, 0, true},
		{"never takeable: counted, passed over", relay.Permanent("amqp: routing key longer than 255 bytes"), nil, 9, 7, 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &runner{cfg: Config{DB: pool, Table: table}, log: slog.New(slog.DiscardHandler), rec: lockRecords(t, pool, table)}
			if _, err := pool.Exec(ctx, `DELETE FROM `+table.Side("replay")); err != nil {
				t.Fatal(err)
			}
			var err error
			if r.run, err = r.rec.start(ctx, Record{Stream: "S", Exchange: "X", Request: "from-seq=1", FromSeq: 1, ToSeq: 9}); err != nil {
				t.Fatal(err)
			}
			msg := &relay.Message{MessageID: "m"}
			mk := func(seqs ...uint64) *batch {
				b := &batch{done: make(chan struct{})}
				for _, s := range seqs {
					it := item{seq: s, msg: msg}
					if s == 5 {
						it.err = tc.fail
					}
					if s == 2 {
						it.skip, it.msg = skipWithoutID, nil
					}
					b.items = append(b.items, it)
				}
				close(b.done)
				return b
			}
			sent, sem := make(chan *batch, 3), make(chan struct{}, 3)
			for _, b := range []*batch{mk(1, 2, 3), mk(4, 5, 6), mk(7, 8, 9)} {
				sem <- struct{}{}
				sent <- b
			}
			close(sent)
			stopped := false
			res := r.settle(ctx, sent, sem, func() { stopped = true })
			if !errors.Is(res.err, tc.wantErr) || (res.err == nil && tc.wantErr != nil) {
				t.Fatalf("settle error %v, want %v", res.err, tc.wantErr)
			}
			if stopped != tc.stops || res.stopped != tc.stops {
				t.Errorf("reading stopped %v, settle stopped %v; want %v", stopped, res.stopped, tc.stops)
			}
			var pos, nSent, noID, perm int64
			if err := pool.QueryRow(ctx, `SELECT position, sent, without_id, failed_permanent FROM `+table.Side("replay")).Scan(&pos, &nSent, &noID, &perm); err != nil {
				t.Fatal(err)
			}
			if pos != tc.wantPos || nSent != tc.wantSent || noID != 1 || perm != tc.wantPerm {
				t.Errorf("recorded position %d, %d sent, %d without id, %d failed permanent; want %d, %d, 1, %d",
					pos, nSent, noID, perm, tc.wantPos, tc.wantSent, tc.wantPerm)
			}
			if r.sum.FailedPermanent != tc.wantPerm || r.sum.Failed != map[bool]int64{true: 1}[tc.wantErr != nil] {
				t.Errorf("summary: %d failed permanent, %d failed", r.sum.FailedPermanent, r.sum.Failed)
			}
		})
	}
}
