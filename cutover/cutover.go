// Package cutover decides when consumers may switch to JetStream
// exclusively, from the migration guidance's observable trigger: nothing
// pending for the stream in the outbox, every running relay writing to it,
// the legacy queue empty with no consumer, the durable JetStream consumer with no pending and no unacked
// message — all of it holding, with the stream not moving, through a quiet
// interval of at least one AckWait.
package cutover

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// Config says what to check.
type Config struct {
	// DB and Table: the outbox. Required.
	DB    *pgxpool.Pool
	Table schema.Table
	// JS, Stream and Consumer: the durable consumer that takes over. Required.
	JS       jetstream.JetStream
	Stream   string
	Consumer string
	// AMQPURL and Queue: the legacy queue; skipped when Queue is empty.
	AMQPURL string
	Queue   string
	// AMQPTLS is used for amqps:// URLs. Default: system roots.
	AMQPTLS *tls.Config
	// QuietPeriod overrides the quiet interval. Default: the consumer's
	// AckWait, or its last BackOff step if longer; with Conservative,
	// AckWait × (MaxAckPending + 1).
	QuietPeriod  time.Duration
	Conservative bool
	// Instances are relayd metrics addresses (host:port) that must all
	// report the same version on /version. Optional.
	Instances []string
	// Poll is how often conditions are sampled during the quiet interval.
	// Default 500ms.
	Poll time.Duration
	// OnSample, when set, is told each sample during the quiet interval.
	OnSample func(elapsed, total time.Duration)
}

// Condition is one line of the verdict.
type Condition struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Result is the verdict: OK only when every condition holds.
type Result struct {
	OK          bool          `json:"ok"`
	Conditions  []Condition   `json:"conditions"`
	QuietPeriod time.Duration `json:"-"`
	// QuietPeriodSeconds is QuietPeriod, in relayd's JSON unit.
	QuietPeriodSeconds float64 `json:"quiet_period_seconds"`
}

// The conditions, by name.
const (
	CondOutbox    = "outbox"
	CondPhases    = "relayd phases"
	CondQueue     = "legacy queue"
	CondConsumer  = "jetstream consumer"
	CondQuiet     = "quiescence"
	CondInstances = "relayd versions"
)

// snapshot is what the point-in-time conditions saw.
type snapshot struct {
	conds   []Condition
	lastSeq uint64
	ackWait time.Duration
	backoff []time.Duration
	maxAck  int
}

func (s snapshot) ok() bool {
	for _, c := range s.conds {
		if !c.OK {
			return false
		}
	}
	return true
}

// Check evaluates every condition once, then — if they hold — watches them
// and the stream's last sequence through the quiet interval.
func Check(ctx context.Context, cfg Config) (Result, error) {
	if cfg.DB == nil || cfg.JS == nil || cfg.Stream == "" || cfg.Consumer == "" {
		return Result{}, errors.New("cutover: DB, JS, Stream and Consumer are required")
	}
	if cfg.Poll == 0 {
		cfg.Poll = 500 * time.Millisecond
	}
	first, err := sample(ctx, cfg)
	if err != nil {
		return Result{}, err
	}
	quiet := cfg.QuietPeriod
	if quiet == 0 && first.ok() { // a consumer that did not answer gave no AckWait
		quiet = first.ackWait
		if n := len(first.backoff); n > 0 && first.backoff[n-1] > quiet {
			quiet = first.backoff[n-1]
		}
		if cfg.Conservative {
			if first.maxAck < 1 {
				// Unlimited (-1): the bound would be 0, no quiet at all.
				return Result{}, fmt.Errorf("cutover: the conservative quiet interval is AckWait × (MaxAckPending + 1), and consumer %q has no MaxAckPending limit (%d): give the quiet interval", cfg.Consumer, first.maxAck)
			}
			quiet = first.ackWait * time.Duration(first.maxAck+1)
		}
	}
	res := Result{QuietPeriod: quiet, QuietPeriodSeconds: quiet.Seconds(), Conditions: first.conds}
	res.Conditions = append(res.Conditions, versions(ctx, cfg.Instances)...)
	if !first.ok() || !allOK(res.Conditions) {
		res.Conditions = append(res.Conditions, Condition{Name: CondQuiet, Detail: "not watched: a condition above fails"})
		return res, nil
	}

	// Quiescence: the same conditions, and no publish to the stream, for
	// the whole quiet interval.
	start := time.Now()
	quietCond := Condition{Name: CondQuiet, OK: true}
	t := time.NewTicker(cfg.Poll)
	defer t.Stop()
	for elapsed := time.Duration(0); elapsed < quiet; elapsed = time.Since(start) {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-t.C:
		}
		s, err := sample(ctx, cfg)
		if err != nil {
			return res, err
		}
		if cfg.OnSample != nil {
			cfg.OnSample(time.Since(start), quiet)
		}
		if !s.ok() {
			for _, c := range s.conds {
				if !c.OK {
					quietCond = Condition{Name: CondQuiet, Detail: fmt.Sprintf("%s stopped holding after %s: %s", c.Name, time.Since(start).Round(time.Millisecond), c.Detail)}
				}
			}
			break
		}
		if s.lastSeq != first.lastSeq {
			quietCond = Condition{Name: CondQuiet, Detail: fmt.Sprintf("stream last sequence moved %d -> %d after %s: a publish during the quiet interval", first.lastSeq, s.lastSeq, time.Since(start).Round(time.Millisecond))}
			break
		}
	}
	if quietCond.OK {
		quietCond.Detail = fmt.Sprintf("all of the above held and the stream stayed at sequence %d for %s", first.lastSeq, quiet)
	}
	res.Conditions = append(res.Conditions, quietCond)
	res.OK = allOK(res.Conditions)
	return res, nil
}

func allOK(cs []Condition) bool {
	for _, c := range cs {
		if !c.OK {
			return false
		}
	}
	return true
}

// sample reads the point-in-time conditions, fresh.
func sample(ctx context.Context, cfg Config) (snapshot, error) {
	var s snapshot
	stats, err := relay.ReadStats(ctx, cfg.DB, cfg.Table, []relay.Target{relay.TargetNATS})
	if err != nil {
		return s, fmt.Errorf("cutover: outbox: %w", err)
	}
	n := stats[0]
	// Rows that left the outbox without JetStream lately: once consumers
	// read only JetStream, such an instance's rows reach nobody.
	amqpOnly, _, _, err := relay.FinishedWithoutNATS(ctx, cfg.DB, cfg.Table, relay.DualWriteLookback, time.Time{})
	if err != nil {
		return s, fmt.Errorf("cutover: delivered rows: %w", err)
	}
	c0 := Condition{
		Name:   CondOutbox,
		OK:     n.Pending == 0 && n.Parked == 0 && amqpOnly == 0,
		Detail: fmt.Sprintf("pending for nats %d, parked %d, lag %s", n.Pending, n.Parked, n.Lag.Round(time.Millisecond)),
	}
	if amqpOnly > 0 {
		c0.Detail += fmt.Sprintf("; %d rows finished in the last %s without JetStream: an instance runs without nats in RELAY_TARGETS", amqpOnly, relay.DualWriteLookback)
	}
	s.conds = append(s.conds, c0)

	cp, err := relaydPhases(ctx, cfg)
	if err != nil {
		return s, fmt.Errorf("cutover: %w", err)
	}
	s.conds = append(s.conds, cp)

	if cfg.Queue != "" {
		c := Condition{Name: CondQueue}
		msgs, consumers, err := queueState(cfg.AMQPURL, cfg.AMQPTLS, cfg.Queue)
		if err != nil {
			c.Detail = "cannot read queue " + cfg.Queue + ": " + err.Error()
		} else {
			c.OK = msgs == 0 && consumers == 0
			c.Detail = fmt.Sprintf("queue %s: %d ready, %d consumers", cfg.Queue, msgs, consumers)
		}
		s.conds = append(s.conds, c)
	}

	si, ci, err := readConsumer(ctx, cfg)
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) || ctx.Err() != nil {
		return s, err
	}
	if err != nil {
		// No answer: in a cluster, the stream's or the consumer's leader
		// lost and a new one not yet elected (4 to 9 s). Not holding, so
		// that --wait asks again.
		s.conds = append(s.conds, Condition{Name: CondConsumer, Detail: "cannot read: " + err.Error()})
		return s, nil
	}
	s.lastSeq = si.State.LastSeq
	s.ackWait, s.backoff, s.maxAck = ci.Config.AckWait, ci.Config.BackOff, ci.Config.MaxAckPending
	c := Condition{
		Name: CondConsumer,
		OK:   ci.NumPending == 0 && ci.NumAckPending == 0,
		Detail: fmt.Sprintf("consumer %s: pending %d, ack pending %d, redelivered %d, delivered stream seq %d, ack floor %d, stream last seq %d",
			cfg.Consumer, ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.Delivered.Stream, ci.AckFloor.Stream, si.State.LastSeq),
	}
	// Its figures say what the application has processed only if it acks
	// (with AckNone, ack pending is 0 while messages are in its hands) and
	// the consumer outlives a restart (an ephemeral one goes, and the
	// application's next one starts wherever it is told).
	switch {
	case ci.Config.AckPolicy == jetstream.AckNonePolicy:
		c.OK, c.Detail = false, fmt.Sprintf("consumer %s does not ack (AckNone): its ack pending is always 0, whatever the application has processed; the application's consumer must ack", cfg.Consumer)
	case ci.Config.Durable == "":
		c.OK, c.Detail = false, fmt.Sprintf("consumer %s is not durable: the application's consumer must be, or its position goes with it", cfg.Consumer)
	}
	s.conds = append(s.conds, c)
	return s, nil
}

// readConsumer reads the stream's and the consumer's info, fresh.
func readConsumer(ctx context.Context, cfg Config) (*jetstream.StreamInfo, *jetstream.ConsumerInfo, error) {
	st, err := cfg.JS.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, nil, fmt.Errorf("cutover: stream %s: %w", cfg.Stream, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("cutover: stream %s: %w", cfg.Stream, err)
	}
	cons, err := st.Consumer(ctx, cfg.Consumer)
	if err != nil {
		return nil, nil, fmt.Errorf("cutover: consumer %s: %w", cfg.Consumer, err)
	}
	ci, err := cons.Info(ctx) // fresh, not CachedInfo
	if err != nil {
		return nil, nil, fmt.Errorf("cutover: consumer %s: %w", cfg.Consumer, err)
	}
	return si, ci, nil
}

func queueState(url string, tlsCfg *tls.Config, queue string) (messages, consumers int, err error) {
	conn, err := amqpio.DialURL(url, amqpio.DialOptions{TLS: tlsCfg, Timeout: 10 * time.Second})
	if err != nil {
		return 0, 0, err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return 0, 0, err
	}
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		return 0, 0, err
	}
	return q.Messages, q.Consumers, nil
}

// versions asks each instance for its version: all must answer the same.
func versions(ctx context.Context, addrs []string) []Condition {
	if len(addrs) == 0 {
		return nil
	}
	seen := map[string][]string{}
	var bad []string
	client := &http.Client{Timeout: 5 * time.Second}
	for _, a := range addrs {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a+"/version", nil)
		if err != nil {
			bad = append(bad, a+": "+err.Error())
			continue
		}
		resp, err := client.Do(req)
		if err != nil {
			bad = append(bad, a+": unreachable")
			continue
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 256))
		resp.Body.Close()
		v := strings.TrimSpace(string(b))
		if resp.StatusCode != http.StatusOK || v == "" {
			// Not a relayd's answer (a relayd too old for /version, a
			// proxy's error page): error pages that agree prove nothing.
			bad = append(bad, fmt.Sprintf("%s: /version answered %s", a, resp.Status))
			continue
		}
		seen[v] = append(seen[v], a)
	}
	c := Condition{Name: CondInstances}
	var parts []string
	for v, as := range seen {
		parts = append(parts, fmt.Sprintf("%s on %s", v, strings.Join(as, ", ")))
	}
	c.OK = len(bad) == 0 && len(seen) == 1
	c.Detail = strings.Join(append(parts, bad...), "; ")
	return []Condition{c}
}
