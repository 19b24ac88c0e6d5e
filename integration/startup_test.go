package integration

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/outbox"
)

// relayd started before Postgres and RabbitMQ accept connections (a compose
// or pod start) waits for them, up to RELAY_STARTUP_TIMEOUT, and starts.
func TestRelayWaitsForPostgresAndRabbitMQAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	late := func(name, rawURL string, after time.Duration) string {
		u, err := url.Parse(rawURL)
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		p := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), name, addr, u.Host)
		t.Cleanup(p.Stop)
		time.AfterFunc(after, func() {
			if err := p.Start(); err != nil {
				t.Errorf("start %s proxy: %v", name, err)
			}
		})
		u.Host = addr
		return u.String()
	}
	start := time.Now()
	// Postgres first, RabbitMQ two seconds later: each is waited for.
	e.startRelay("relayd", "RELAY_DATABASE_URL="+late("pg", e.dbURL, 2*time.Second),
		"RELAY_AMQP_URL="+late("amqp", e.amqpURL, 4*time.Second), "RELAY_STARTUP_TIMEOUT=20s")
	if waited := time.Since(start); waited < 4*time.Second {
		t.Fatalf("started after %v, before Postgres and RabbitMQ were reachable", waited)
	}
}

// A service that does not answer at start is named in the log at once —
// which, where (without the password) and why — not after
// RELAY_STARTUP_TIMEOUT of silence (it used to print nothing for 30 s).
func TestStartupNamesTheServiceItWaitsFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		service string
		env     func(closed string) string
	}{
		{"postgres", func(closed string) string {
			return "RELAY_DATABASE_URL=postgres://relay:s3cret@" + closed + "/app?sslmode=disable"
		}},
		{"rabbitmq", func(closed string) string { return "RELAY_AMQP_URL=amqp://guest:s3cret@" + closed + "/" }},
		{"nats", func(closed string) string { return "RELAY_NATS_URL=nats://relay:s3cret@" + closed }},
	} {
		t.Run(tc.service, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			closed := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			start := time.Now()
			p := e.startUnready("relayd", tc.env(closed), "RELAY_STARTUP_TIMEOUT=30s")
			var line string
			testenv.Eventually(t, 2*time.Second, func() bool {
				for l := range strings.Lines(p.out.String()) {
					if strings.Contains(l, `msg="waiting for `+tc.service+`"`) {
						line = l
						return true
					}
				}
				return false
			}, "no log line naming %s within 2 s of the start", tc.service)
			for _, want := range []string{"service=" + tc.service, closed, "xxxxx@" + closed, "connection refused"} {
				if tc.service == "postgres" && want == "xxxxx@"+closed {
					want = "relay@" + closed // a DSN's password is left out, not masked
				}
				if tc.service == "nats" && want == "connection refused" {
					want = "error=" // nats.go: "no servers available for connection"
				}
				if !strings.Contains(line, want) {
					t.Errorf("after %v: %q lacks %q", time.Since(start), line, want)
				}
			}
			if strings.Contains(p.out.String(), "s3cret") {
				t.Errorf("the password is in the log:\n%s", p.out.String())
			}
			if !p.running() {
				t.Fatalf("relayd exited instead of waiting: %v", p.err)
			}
		})
	}
}

// An on-call engineer's `relayd status` against a Postgres that is down
// (nothing listening) or that does not answer (accepts, says nothing)
// fails within seconds, exit 1, with the reason on one plain line — not
// after RELAY_STARTUP_TIMEOUT.
func TestStatusFailsFastWithoutPostgres(t *testing.T) {
	t.Parallel()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	for _, tc := range []struct {
		name, addr, reason string
	}{
		{"down", fmt.Sprintf("127.0.0.1:%d", freePort(t)), ": dial tcp "},
		{"silent", silent.Addr().String(), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(relaydBin, "status")
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "RELAY_DATABASE_URL=postgres://relay:s3cret@" + tc.addr + "/app?sslmode=disable", "RELAY_STARTUP_TIMEOUT=60s"}
			dieWithTest(cmd)
			start := time.Now()
			out, err := cmd.CombinedOutput()
			took := time.Since(start)
			if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 1 || took > 10*time.Second {
				t.Fatalf("relayd status: %v after %v, want exit 1 within 10 s:\n%s", err, took, out)
			}
			want := "relayd status: Postgres at " + tc.addr + " did not answer within 5s" + tc.reason
			if !strings.HasPrefix(string(out), want) || strings.Count(string(out), "\n") != 1 || strings.Contains(string(out), "s3cret") {
				t.Errorf("relayd status: output is not one line starting %q (or has the password):\n%s", want, out)
			}
		})
	}
}

// Through PgBouncer in session mode, told to ignore relayd's startup
// parameters (docs/deploying.md), relayd runs as on a direct connection:
// woken by LISTEN, every row delivered once to each broker, a clean stop.
func TestRelayThroughPgBouncerSessionPooling(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	via := testenv.PgBouncer(t, "session", "idle_in_transaction_session_timeout", "jit")
	r := e.startRelay("relay", "RELAY_DATABASE_URL="+via)
	ctx := context.Background()
	ids := map[string]bool{}
	for i := range 200 {
		written, err := e.writer.Write(ctx, e.pool, outbox.Message{Topic: "orders.pooled", Payload: []byte{byte(i)}})
		if err != nil {
			t.Fatal(err)
		}
		ids[written[0]] = true
	}
	e.waitDelivered(30 * time.Second)
	e.checkExactlyOnce(ids, false)
	if code := r.stop(30 * time.Second); code != 0 {
		t.Fatalf("relayd exited %d through PgBouncer:\n%s", code, r.out.String())
	}
}
