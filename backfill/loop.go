package backfill

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/backoff"
)

// errLost means the RabbitMQ connection went away mid-run: reconnect.
var errLost = errors.New("amqp connection lost")

// errNotDrained means a connection stopped at a drained queue or at the
// limit, then had to requeue messages that could not move for now: go on.
var errNotDrained = errors.New("requeued after the drain")

// reconnectBackoff spaces the connections after one is lost.
var reconnectBackoff = backoff.Doubling{Floor: 200 * time.Millisecond, Cap: 10 * time.Second}

// permanentAfter is how long RabbitMQ must keep giving a permanentAMQP
// answer for the run to stop.
const permanentAfter = 30 * time.Second

// loop consumes on one connection after another, reconnecting with capped
// backoff, until one ends the run.
func (b *runner) loop(ctx context.Context) error {
	wait := time.Duration(0)
	var permanentSince time.Time // since when every connection met permanentAMQP
	for {
		err := b.consumeOnce(ctx)
		if errors.Is(err, errNotDrained) {
			wait, permanentSince = 0, time.Time{}
			continue
		}
		if !errors.Is(err, errLost) {
			b.progress()
			return err
		}
		if ae := (*amqp.Error)(nil); errors.As(err, &ae) && permanentAMQP(ae.Code) {
			// A restarting cluster node gives these answers for a while
			// too: only a lasting one ends the run.
			if permanentSince.IsZero() {
				permanentSince = time.Now()
			}
			if time.Since(permanentSince) >= permanentAfter {
				b.progress()
				return fmt.Errorf("%w (RabbitMQ's answer for %s)", err, permanentAfter)
			}
		} else {
			permanentSince = time.Time{}
		}
		wait = reconnectBackoff.Next(wait)
		b.log.Warn("backfill: reconnecting to RabbitMQ", "in", wait.String(), "error", err.Error())
		if !backoff.Sleep(ctx, wait) {
			b.progress()
			return ctx.Err()
		}
	}
}

// permanentAMQP says whether a RabbitMQ error code means the run cannot go
// on — no such queue or virtual host, or access refused — when RabbitMQ
// keeps giving it for permanentAfter.
func permanentAMQP(code int) bool {
	switch code {
	case amqp.NotFound, amqp.AccessRefused, amqp.NotAllowed:
		return true
	}
	return false
}

// consumeOnce consumes on one connection. It returns nil when the run is
// over (drained, limit), ctx's error on cancel, or errLost.
func (b *runner) consumeOnce(ctx context.Context) error {
	c, err := b.open(ctx)
	if err != nil {
		return err
	}
	defer c.close()
	if err := c.consume(ctx); err != nil {
		return err
	}
	return c.finish(ctx)
}
