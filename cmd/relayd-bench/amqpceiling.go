package main

import (
	"context"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/google/uuid"
	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
)

// amqpPublishing is a message as relayd publishes it (amqpsink.Publishing
// of a row without headers: persistent, a 36-char message-id, a timestamp)
// or, plain, persistent with a short message-id only.
func (b *bench) amqpPublishing(i int, relaydProps bool, ts time.Time) amqp.Publishing {
	if relaydProps {
		return amqpsink.Publishing(&relay.Message{MessageID: uuid.NewString(), CreatedAt: ts, Payload: b.payload})
	}
	return amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: fmt.Sprint(i), Body: b.payload}
}

// amqpPublish publishes n persistent, mandatory messages to the corner's
// topic exchange (bound to its durable queue) in confirm mode, amqpInFlight
// unconfirmed at most, on a connection of its own, and waits for every
// confirm. The messages stay in the queue.
func (b *bench) amqpPublish(ctx context.Context, cr *corner, n int, relaydProps bool) (Ceiling, error) {
	c := Ceiling{Key: ceilAMQPPlain, Messages: n,
		Name: fmt.Sprintf("RabbitMQ publish, confirms, %s in flight, persistent, mandatory, topic exchange → durable queue; plain (short message-id only)", thousands(amqpInFlight))}
	if relaydProps {
		c.Key = ceilAMQPRelayd
		c.Name = "RabbitMQ publish, the same with relayd's properties (36-char message-id, timestamp)"
	}
	// amqp091-go's own transport, not amqpio.DialURL's: the ceiling is the
	// stock client's.
	conn, err := amqp.Dial(b.o.AMQPURL)
	if err != nil {
		return c, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return c, err
	}
	if err := ch.Confirm(false); err != nil {
		return c, err
	}
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation, amqpInFlight+1))
	returns := ch.NotifyReturn(make(chan amqp.Return, amqpInFlight+1))
	msgs := make([]amqp.Publishing, n)
	ts := time.Now()
	for i := range msgs {
		msgs[i] = b.amqpPublishing(i, relaydProps, ts)
	}

	window := make(chan struct{}, amqpInFlight)
	var nacked, returned int
	done := make(chan error, 1)
	go func() {
		// Every publish gets one confirm; a return (none expected: the
		// queue is bound) comes before its confirm.
		for got := 0; got < n; {
			select {
			case cf, ok := <-confirms:
				if !ok {
					done <- fmt.Errorf("channel closed after %d of %d confirms", got, n)
					return
				}
				if !cf.Ack {
					nacked++
				}
				got++
				<-window
			case <-returns:
				returned++
			}
		}
		done <- nil
	}()
	snap := takeCPUSnap()
	start := time.Now()
	for i := range n {
		select {
		case window <- struct{}{}:
		case err := <-done:
			return c, err
		}
		if err := ch.PublishWithContext(ctx, cr.exchange, topic, true, false, msgs[i]); err != nil {
			return c, err
		}
	}
	if err := <-done; err != nil {
		return c, err
	}
	elapsed := time.Since(start)
	c.CPU = cpuSplit(snap, takeCPUSnap(), n)
	if nacked > 0 || returned > 0 {
		return c, fmt.Errorf("%d nacked, %d returned", nacked, returned)
	}
	c.measured(n, elapsed)
	return c, nil
}

// amqpConsume drains n messages from the corner's queue with manual acks,
// prefetch consumePrefetch, acking as the backfill does: one multiple-ack
// per consumeAckEvery messages (and one for the last). Acking whenever no
// more deliveries are waiting would ack every few messages of a consumer
// faster than the broker, and measure the acks.
func (b *bench) amqpConsume(ctx context.Context, cr *corner, n int) (Ceiling, error) {
	c := Ceiling{Key: ceilAMQPConsume, Messages: n,
		Name: fmt.Sprintf("RabbitMQ consume, prefetch %s, manual multiple-ack per %d messages, 64 KiB reads (as the backfill acks and reads), the messages above", thousands(consumePrefetch), consumeAckEvery)}
	// The backfill's connection (amqpio: 64 KiB reads), so that the
	// ceiling gets what the backfill gets from it.
	conn, err := amqpio.DialURL(b.o.AMQPURL, amqpio.DialOptions{Timeout: 30 * time.Second})
	if err != nil {
		return c, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return c, err
	}
	if err := ch.Qos(consumePrefetch, 0, false); err != nil {
		return c, err
	}
	snap := takeCPUSnap()
	start := time.Now()
	deliveries, err := ch.ConsumeWithContext(ctx, cr.queue, "relayd-bench", false, false, false, false, nil)
	if err != nil {
		return c, err
	}
	idle := time.NewTimer(consumeIdleBudget)
	defer idle.Stop()
	unacked := 0
	for got := 0; got < n; {
		select {
		case d, ok := <-deliveries:
			if !ok {
				return c, fmt.Errorf("consumer closed after %d of %d", got, n)
			}
			got++
			if unacked++; unacked >= consumeAckEvery || got == n {
				if err := d.Ack(true); err != nil {
					return c, err
				}
				unacked = 0
			}
			if got%1000 == 0 {
				idle.Reset(consumeIdleBudget)
			}
		case <-idle.C:
			return c, fmt.Errorf("no delivery for %v after %d of %d", consumeIdleBudget, got, n)
		case <-ctx.Done():
			return c, ctx.Err()
		}
	}
	elapsed := time.Since(start)
	c.CPU = cpuSplit(snap, takeCPUSnap(), n)
	c.measured(n, elapsed)
	return c, nil
}
