package inbox

import (
	"context"
	"time"

	"github.com/relayd/relayd/internal/errlog"
)

// cleanupBatch is how many rows one DELETE removes; small batches keep each
// statement's locks and WAL short.
const cleanupBatch = 1000

// cleanupBatchTimeout bounds one batch.
const cleanupBatchTimeout = 30 * time.Second

// Cleanup deletes this consumer group's ids recorded more than
// [Config.Retention] ago, 1000 rows per statement until a batch comes back
// short, and returns how many it deleted. Rows another instance is deleting
// at the same moment are skipped, so instances can run it concurrently.
// Other consumer groups' rows are left alone.
func (in *Inbox) Cleanup(ctx context.Context) (deleted int64, err error) {
	for {
		n, err := in.cleanupOnce(ctx)
		deleted += n
		if err != nil {
			return deleted, in.dbError("cleanup", err)
		}
		if n < cleanupBatch {
			return deleted, nil
		}
	}
}

func (in *Inbox) cleanupOnce(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, cleanupBatchTimeout)
	defer cancel()
	tag, err := in.pool.Exec(ctx, in.cleanupSQL, in.cfg.Consumer, in.cfg.Retention.Milliseconds(), cleanupBatch)
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// RunCleanup runs [Inbox.Cleanup] at once and then every interval (1 minute
// if interval <= 0) until ctx is done. Errors are logged, the first of a run
// at once and then at most one every 30 seconds, and one line says when
// cleanup recovers; context cancellation is not an error.
func (in *Inbox) RunCleanup(ctx context.Context, interval time.Duration) {
	if interval <= 0 {
		interval = time.Minute
	}
	errs := errlog.New(in.log, "inbox cleanup")
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := in.Cleanup(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			errs.Error(err)
		} else {
			errs.OK()
			if n > 0 {
				in.log.Debug("inbox cleanup", "deleted", n, "table", in.table.String(), "consumer", in.cfg.Consumer)
			}
		}
		if in.cleanupHook != nil {
			in.cleanupHook(err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
