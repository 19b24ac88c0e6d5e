package main

import (
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// waitLogEvery is how often a wait for a service is logged again.
const waitLogEvery = 5 * time.Second

// hostConnectTimeout bounds the attempt on each host of a multi-host
// RELAY_DATABASE_URL without a connect_timeout of its own.
const hostConnectTimeout = 3 * time.Second

// waitAttempt bounds one Postgres connection attempt (or the URL's
// connect_timeout, if longer), so that a server that does not answer at all
// is logged while relayd waits, not only at the deadline.
const waitAttempt = 5 * time.Second

// waitLog says that relayd is waiting for a service: at the first failed
// attempt, then every waitLogEvery. Without it a start against an
// unreachable service was silent for the whole RELAY_STARTUP_TIMEOUT.
type waitLog struct {
	log     *slog.Logger
	service string // postgres, rabbitmq or nats
	url     string // redacted: never a password
	timeout time.Duration
	start   time.Time
	next    time.Time
	told    bool
}

func newWaitLog(log *slog.Logger, service, redactedURL string, timeout time.Duration) *waitLog {
	return &waitLog{log: log, service: service, url: redactedURL, timeout: timeout, start: time.Now()}
}

// failed notes a failed attempt, logging it unless one was logged lately.
func (w *waitLog) failed(err error) {
	now := time.Now()
	if w.told && now.Before(w.next) {
		return
	}
	w.told, w.next = true, now.Add(waitLogEvery)
	w.log.Warn("waiting for "+w.service, "service", w.service, "url", w.url, "error", err.Error(),
		"waited", now.Sub(w.start).Round(100*time.Millisecond).String(), "timeout", w.timeout.String())
}

// reached logs that the service answered, if a wait for it was logged.
func (w *waitLog) reached() {
	if w.told {
		w.log.Info(w.service+" reachable", "service", w.service, "url", w.url,
			"waited", time.Since(w.start).Round(100*time.Millisecond).String())
	}
}

// postgresForLog names the servers a pool config connects to — every host
// of a multi-host URL, in the order tried — without its password (a
// key=value DSN has no URL to redact).
func postgresForLog(pc *pgxpool.Config) string {
	c := pc.ConnConfig
	return fmt.Sprintf("postgres://%s@%s/%s", c.User, strings.Join(postgresHosts(pc), ","), c.Database)
}

// postgresHosts lists the servers a pool config connects to, each once, in
// the order pgx tries them.
func postgresHosts(pc *pgxpool.Config) []string {
	c := pc.ConnConfig
	hosts := []string{hostPort(c.Host, c.Port)}
	for _, fb := range c.Fallbacks {
		// sslmode=prefer (the default) tries each host with TLS, then without.
		if h := hostPort(fb.Host, fb.Port); !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

func hostPort(host string, port uint16) string {
	if host != "" && host[0] == '/' {
		return host // a Unix socket directory
	}
	if port == 0 {
		return host
	}
	return net.JoinHostPort(host, strconv.Itoa(int(port)))
}
