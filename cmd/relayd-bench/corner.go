package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/relayd/relayd/schema"
)

// topic is the outbox topic (and AMQP routing key) every benchmark message
// uses; the subject is the corner's prefix + topic.
const topic = "bench.msg"

// corner is one measurement's private part of the three services. Every
// part is optional; close removes what was made.
type corner struct {
	b        *bench
	name     string
	table    schema.Table // zero: none
	stream   string       // "": none
	prefix   string
	exchange string // "": none
	queue    string
	// What a measurement made beside: more streams (counted with the
	// corner's) and exchanges, removed by close.
	extraStreams, extraExchanges []string
}

type cornerSpec struct{ table, stream, amqp bool }

func (b *bench) newCorner(ctx context.Context, spec cornerSpec) (_ *corner, err error) {
	c := &corner{b: b, name: newName()}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if spec.table {
		t := schema.Table{Schema: c.name, Name: "outbox"}
		db := stdlib.OpenDBFromPool(b.pool)
		_, err := schema.Up(ctx, db, t, nil)
		db.Close()
		c.table = t // set before checking err: close drops a half-made schema
		if err != nil {
			return nil, fmt.Errorf("migrate %s: %w", t, err)
		}
	}
	if spec.stream {
		c.stream, c.prefix = strings.ToUpper(c.name), c.name+"."
		if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
			Name: c.stream, Subjects: []string{c.prefix + ">"},
			Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
		}); err != nil {
			c.stream = ""
			return nil, fmt.Errorf("create stream: %w", err)
		}
	}
	if spec.amqp {
		ch, err := b.amqpConn.Channel()
		if err != nil {
			return nil, err
		}
		defer ch.Close()
		c.exchange, c.queue = c.name, c.name+"_q"
		if err := ch.ExchangeDeclare(c.exchange, "topic", true, false, false, false, nil); err != nil {
			return nil, err
		}
		if _, err := ch.QueueDeclare(c.queue, true, false, false, false, nil); err != nil {
			return nil, err
		}
		if err := ch.QueueBind(c.queue, "#", c.exchange, false, nil); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *corner) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := c.b
	for _, s := range append([]string{c.stream}, c.extraStreams...) {
		if s == "" {
			continue
		}
		if err := b.js.DeleteStream(ctx, s); err != nil {
			b.logf("cleanup: delete stream %s: %v", s, err)
		}
	}
	if ch, err := b.amqpConn.Channel(); err == nil && len(c.extraExchanges) > 0 {
		for _, x := range c.extraExchanges {
			if err := ch.ExchangeDelete(x, false, false); err != nil {
				b.logf("cleanup: delete exchange %s: %v", x, err)
			}
		}
		ch.Close()
	}
	if c.exchange != "" {
		if ch, err := b.amqpConn.Channel(); err == nil {
			if _, err := ch.QueueDelete(c.queue, false, false, false); err != nil {
				b.logf("cleanup: delete queue %s: %v", c.queue, err)
			} else if err := ch.ExchangeDelete(c.exchange, false, false); err != nil {
				b.logf("cleanup: delete exchange %s: %v", c.exchange, err)
			}
			ch.Close()
		}
	}
	if c.table.Schema != "" {
		if _, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+c.table.Schema+`" CASCADE`); err != nil {
			b.logf("cleanup: drop schema %s: %v", c.table.Schema, err)
		}
	}
}

// fill inserts n rows of the benchmark payload in one statement, then
// ANALYZEs the table and checkpoints, so that the measurement that follows
// pays neither for stale statistics nor for the fill's dirty buffers. With
// keys > 0 the rows carry that many distinct keys taking turns (row i has
// key i mod keys), as many aggregates written at once do; with 0, no key.
func (c *corner) fill(ctx context.Context, n, keys int) error {
	tbl := c.table.Ident()
	if _, err := c.b.pool.Exec(ctx, `INSERT INTO `+tbl+` (topic, key, payload)
		SELECT $1, CASE WHEN $4::int > 0 THEN 'key-' || (i % $4::int) END, $2::bytea FROM generate_series(1, $3) i`,
		topic, c.b.payload, n, keys); err != nil {
		return fmt.Errorf("fill %s: %w", c.table, err)
	}
	if _, err := c.b.pool.Exec(ctx, `ANALYZE `+tbl); err != nil {
		return fmt.Errorf("analyze %s: %w", c.table, err)
	}
	c.b.checkpoint(ctx)
	return nil
}

// fillTopics inserts n rows of the benchmark payload with null keys, as
// fill does, row i on routesTopic(i mod topics).
func (c *corner) fillTopics(ctx context.Context, n, topics int) error {
	tbl := c.table.Ident()
	if _, err := c.b.pool.Exec(ctx, `INSERT INTO `+tbl+` (topic, payload)
		SELECT 'bench.t' || (i % $3::int) || '.msg', $1::bytea FROM generate_series(1, $2) i`, c.b.payload, n, topics); err != nil {
		return fmt.Errorf("fill %s: %w", c.table, err)
	}
	if _, err := c.b.pool.Exec(ctx, `ANALYZE `+tbl); err != nil {
		return fmt.Errorf("analyze %s: %w", c.table, err)
	}
	c.b.checkpoint(ctx)
	return nil
}

// fillTraced inserts n rows of the benchmark payload with null keys, as
// fill does, each with a W3C traceparent in its headers: random trace and
// parent ids, flags 01 (sampled) on every sampledEvery-th row and 00 on the
// others, the header a traced producer writes.
func (c *corner) fillTraced(ctx context.Context, n, sampledEvery int) error {
	tbl := c.table.Ident()
	if _, err := c.b.pool.Exec(ctx, `INSERT INTO `+tbl+` (topic, headers, payload)
		SELECT $1, jsonb_build_object('traceparent', '00-'
			|| replace(gen_random_uuid()::text, '-', '') || '-'
			|| left(replace(gen_random_uuid()::text, '-', ''), 16) || '-'
			|| CASE WHEN i % $4::int = 0 THEN '01' ELSE '00' END),
			$2::bytea FROM generate_series(1, $3) i`,
		topic, c.b.payload, n, sampledEvery); err != nil {
		return fmt.Errorf("fill %s: %w", c.table, err)
	}
	if _, err := c.b.pool.Exec(ctx, `ANALYZE `+tbl); err != nil {
		return fmt.Errorf("analyze %s: %w", c.table, err)
	}
	c.b.checkpoint(ctx)
	return nil
}

// checkpoint flushes Postgres's dirty buffers now rather than during the
// next measurement. Best effort: it needs superuser (or pg_checkpoint).
func (b *bench) checkpoint(ctx context.Context) {
	b.pool.Exec(ctx, `CHECKPOINT`) //nolint:errcheck // best effort
}

// queueDepth is the number of ready messages in the corner's queue.
func (c *corner) queueDepth() (int, error) {
	ch, err := c.b.amqpConn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(c.queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// streamMsgs is the number of messages in the corner's streams.
func (c *corner) streamMsgs(ctx context.Context) (uint64, error) {
	var n uint64
	for _, name := range append([]string{c.stream}, c.extraStreams...) {
		s, err := c.b.js.Stream(ctx, name)
		if err != nil {
			return 0, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		n += info.State.Msgs
	}
	return n, nil
}

// relaydEnv is the environment of a relayd process working on c; relayd's
// own defaults apply to everything not named here.
func (c *corner) relaydEnv(targets string) []string {
	o := c.b.o
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"RELAY_DATABASE_URL=" + o.DatabaseURL,
		"RELAY_NATS_URL=" + o.NATSURL,
		"RELAY_AMQP_URL=" + o.AMQPURL,
		"RELAY_OUTBOX_TABLE=" + c.table.String(),
		"RELAY_METRICS_ADDR=127.0.0.1:0",
	}
	if targets != "" {
		env = append(env, "RELAY_TARGETS="+targets)
	}
	if c.stream != "" {
		env = append(env, "RELAY_NATS_STREAM="+c.stream, "RELAY_NATS_SUBJECT_PREFIX="+c.prefix)
	}
	if c.exchange != "" {
		env = append(env, "RELAY_AMQP_EXCHANGE="+c.exchange)
	}
	return append(env, o.RelaydEnv...)
}
