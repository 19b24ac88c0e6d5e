package main

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"time"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/internal/metrics"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/natssink"
)

// openSinks connects a sink for each target, checking (or with
// RELAY_PROVISION creating) its stream or exchange first. closeAll closes
// what was opened, in reverse order, also when err is not nil.
func openSinks(ctx context.Context, cfg *config, m *metrics.Relay, log *slog.Logger) (sinks []relay.Sink, closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	for _, t := range cfg.targets {
		var s relay.Sink
		var closeSink func()
		switch t {
		case relay.TargetNATS:
			s, closeSink, err = openNATSSink(ctx, cfg, m, log)
		case relay.TargetAMQP:
			s, closeSink, err = openAMQPSink(ctx, cfg, log)
		default:
			continue
		}
		if closeSink != nil {
			closers = append(closers, closeSink)
		}
		if err != nil {
			return nil, closeAll, err
		}
		sinks = append(sinks, s)
	}
	return sinks, closeAll, nil
}

// openNATSSink connects to NATS and checks the stream. The closer, set once
// connected, closes the connection.
func openNATSSink(ctx context.Context, cfg *config, m *metrics.Relay, log *slog.Logger) (relay.Sink, func(), error) {
	nc, err := connectNATS(ctx, cfg, log)
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, cfg.StartupTimeout)
	defer cancel()
	var found natssink.Stream
	if cfg.NATSStream != "" {
		if found, err = natssink.EnsureStream(sctx, nc, cfg.NATSStream, cfg.NATSSubjectPrefix, cfg.NATSDupWindow, cfg.Provision); err != nil {
			return nil, nc.Close, err
		}
		if found.Warning != "" {
			log.Warn("nats: " + found.Warning)
		}
	}
	// Retries stay inside the shortest duplicate window of the streams used.
	window := found.DuplicateWindow
	if w := checkNATSRoutes(sctx, cfg, nc, log); w > 0 && (window == 0 || w < window) {
		window = w
	}
	s, err := natssink.New(natssink.Config{
		Conn: nc, Stream: cfg.NATSStream, SubjectPrefix: cfg.NATSSubjectPrefix,
		AckTimeout: cfg.PublishTimeout, DuplicateWindow: window, OnDuplicate: m.Duplicate, Logger: log,
	})
	if err != nil {
		return nil, nc.Close, err
	}
	return s, nc.Close, nil
}

// openAMQPSink checks the exchange and connects the RabbitMQ sink, within
// RELAY_STARTUP_TIMEOUT. The closer closes the sink.
func openAMQPSink(ctx context.Context, cfg *config, log *slog.Logger) (relay.Sink, func(), error) {
	tlsCfg, err := cfg.amqpTLS()
	if err != nil {
		return nil, nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, cfg.StartupTimeout)
	defer cancel()
	if err := ensureExchange(sctx, cfg, tlsCfg, log); err != nil {
		return nil, nil, err
	}
	checkAMQPRoutes(sctx, cfg, tlsCfg, log)
	s, err := amqpsink.New(sctx, amqpsink.Config{URL: cfg.AMQPURL, Exchange: cfg.AMQPExchange, TLS: tlsCfg, Logger: log,
		StallTimeout: 2 * cfg.PublishTimeout, HoldAfter: cfg.PublishTimeout})
	if err != nil {
		return nil, nil, err
	}
	return s, func() { s.Close() }, nil
}

// ensureExchange checks (or creates) the exchange. RabbitMQ may still be
// starting: what a refused or reset connection fails is retried until ctx
// is done, and then the last dial's error is returned.
func ensureExchange(ctx context.Context, cfg *config, tlsCfg *tls.Config, log *slog.Logger) error {
	wait := newWaitLog(log, "rabbitmq", redactAMQP(cfg.AMQPURL), cfg.StartupTimeout)
	for {
		err := amqpsink.EnsureExchange(ctx, cfg.AMQPURL, tlsCfg, cfg.AMQPExchange, cfg.Provision)
		var netErr *net.OpError
		if err == nil {
			wait.reached()
			return nil
		}
		if !errors.As(err, &netErr) {
			return err
		}
		wait.failed(err)
		backoff.Sleep(ctx, 500*time.Millisecond)
		if ctx.Err() != nil {
			return err
		}
	}
}
