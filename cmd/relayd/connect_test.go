package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/testenv"
)

// A connection failure is one line: the service, its address, and why.
func TestConnectFailure(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, tc := range []struct {
		service string
		waited  time.Duration
		err     error
		want    string
	}{
		{"Postgres", 5 * time.Second, fmt.Errorf("postgres: %w", errors.New("tls: handshake failure")),
			"could not connect to Postgres at h:1: tls: handshake failure"},
		{"Postgres", 5 * time.Second, fmt.Errorf("postgres: %w", refused),
			"Postgres at h:1 did not answer within 5s: dial tcp: connect: connection refused"},
		{"Postgres", 5 * time.Second, fmt.Errorf("postgres: no answer within 5s: %w", context.DeadlineExceeded),
			"Postgres at h:1 did not answer within 5s"},
		{"Postgres", 5 * time.Second, fmt.Errorf("postgres: %w", &pgconn.PgError{Severity: "FATAL", Message: `password authentication failed for user "x"`, Code: "28P01"}),
			`Postgres at h:1 refused the connection: FATAL: password authentication failed for user "x" (SQLSTATE 28P01)`},
		{"Postgres", 5 * time.Second, &pgconn.PgError{Severity: "FATAL", Message: "unsupported startup parameter: jit", Code: "08P01"},
			"Postgres at h:1 refused the connection: FATAL: unsupported startup parameter: jit (SQLSTATE 08P01): " + errPooler.Error()},
		{"NATS", 5 * time.Second, fmt.Errorf("nats: connect to nats://h:1: %w", nats.ErrNoServers),
			"NATS at h:1 did not answer within 5s: connection refused (nats: no servers available for connection)"},
		{"NATS", 5 * time.Second, fmt.Errorf("nats: connect to nats://h:1: %w", nats.ErrAuthorization),
			"NATS at h:1 refused the connection: nats: authorization violation"},
		{"NATS", 5 * time.Second, errors.New("RELAY_NATS_NKEY: bad seed"),
			"could not connect to NATS at h:1: RELAY_NATS_NKEY: bad seed"},
		{"RabbitMQ", 0, refused, "RabbitMQ at h:1 did not answer: dial tcp: connect: connection refused"},
		{"RabbitMQ", 0, amqp.ErrCredentials, `RabbitMQ at h:1 refused the connection: Exception (403) Reason: "username or password not allowed"`},
	} {
		if got := connectFailure(tc.service, "h:1", tc.waited, tc.err); got != tc.want {
			t.Errorf("connectFailure(%v)\n got %q\nwant %q", tc.err, got, tc.want)
		}
	}
}

// The address printed is the servers' host:port: never a user part, where
// a password or a NATS token is.
func TestURLHosts(t *testing.T) {
	for _, tc := range []struct {
		urls []string
		want string
	}{
		{[]string{"amqp://u:s3cret@h1:5672/", "amqps://u:s3cret@h2:5671/vh"}, "h1:5672,h2:5671"},
		{natsURLs("nats://s3cret@h:4222, h2:4223"), "h:4222,h2:4223"},
		{[]string{"amqp://u:s3/cr@et@h:5672/"}, "h:5672"},
		{[]string{"amqp://u:s3cret,x@h:5672/"}, "h:5672"},
		{[]string{"amqp://u:pw@h:s3cret/"}, "(unparseable URL)"},
		{[]string{"h:5672"}, "(unparseable URL)"},
	} {
		if got := urlHosts(tc.urls); got != tc.want {
			t.Errorf("urlHosts(%q) = %q, want %q", tc.urls, got, tc.want)
		}
	}
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// A one-shot command that cannot reach a service says so on one plain
// line — the command, the service, its address without the password, why —
// and exits 1; not as a log line.
func TestOneShotConnectFailureIsOneLine(t *testing.T) {
	down := closedAddr(t)
	pgDown := "postgres://relay:s3cret@" + down + "/app"
	for _, tc := range []struct {
		args    []string
		env     map[string]string
		service string
	}{
		{[]string{"status", "--connect-timeout", "1s"}, nil, "Postgres"},
		{[]string{"phase", "--connect-timeout", "1s"}, nil, "Postgres"},
		{[]string{"phase", "set", "dual", "--connect-timeout", "1s"}, nil, "Postgres"},
		{[]string{"verify", "--connect-timeout", "1s"}, nil, "Postgres"},
		{[]string{"outbox", "parked", "--connect-timeout", "1s"}, nil, "Postgres"},
		{[]string{"outbox", "retry", "--all", "--connect-timeout", "1s"}, nil, "Postgres"},
		{[]string{"replay", "--connect-timeout", "1s"}, nil, "Postgres"},
		{[]string{"cutover", "check", "--consumer", "c", "--connect-timeout", "1s"}, nil, "Postgres"},
		{[]string{"migrate", "status"}, map[string]string{"RELAY_STARTUP_TIMEOUT": "1s"}, "Postgres"},
		{[]string{"tail", "--connect-timeout", "1s"}, map[string]string{"RELAY_TARGETS": "nats", "RELAY_NATS_URL": "nats://u:s3cret@" + down}, "NATS"},
		{[]string{"tail", "--connect-timeout", "1s"}, map[string]string{"RELAY_TARGETS": "amqp", "RELAY_AMQP_URL": "amqp://u:s3cret@" + down + "/"}, "RabbitMQ"},
		{[]string{"routes", "check", "--connect-timeout", "1s"}, map[string]string{"RELAY_TARGETS": "nats", "RELAY_NATS_URL": "nats://u:s3cret@" + down}, "NATS"},
		{[]string{"routes", "check", "--connect-timeout", "1s", "--json"}, map[string]string{"RELAY_TARGETS": "amqp", "RELAY_AMQP_URL": "amqp://u:s3cret@" + down + "/"}, "RabbitMQ"},
	} {
		t.Run(strings.Join(tc.args, " ")+" "+tc.service, func(t *testing.T) {
			t.Parallel()
			env := map[string]string{"RELAY_DATABASE_URL": pgDown}
			for k, v := range tc.env {
				env[k] = v
			}
			code, _, errOut := runCLI(t, env, tc.args...)
			want := regexp.MustCompile(`^relayd( [a-z]+( [a-z]+)?)?: ` + tc.service + ` at ` + regexp.QuoteMeta(down) + ` did not answer( within 1s)?: .*connection refused.*\n$`)
			if code != exitFailure || !want.MatchString(errOut) || strings.Contains(errOut, "s3cret") {
				t.Errorf("exit %d, stderr %q; want 1 and one line matching %s, without the password", code, errOut, want)
			}
			if name := tc.args[0]; !strings.HasPrefix(errOut, "relayd "+name) {
				t.Errorf("stderr %q does not name relayd %s", errOut, name)
			}
		})
	}
}

// With Postgres up and NATS down, the line names NATS.
func TestOneShotNATSDown(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	down := closedAddr(t)
	env := map[string]string{"RELAY_DATABASE_URL": testenv.DatabaseURL(t), "RELAY_NATS_URL": "nats://u:s3cret@" + down}
	code, _, errOut := runCLI(t, env, "verify", "--connect-timeout", "1s")
	if want := "relayd verify: NATS at " + down + " did not answer within 1s: connection refused (nats: no servers available for connection)\n"; code != exitFailure || errOut != want {
		t.Errorf("verify with NATS down: exit %d, %q; want 1 and %q", code, errOut, want)
	}
}
