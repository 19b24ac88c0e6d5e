package main

import (
	"context"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5/pgconn"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/testenv"
)

// relayd waits up to RELAY_STARTUP_TIMEOUT for a Postgres that is not
// listening yet (a compose or pod start), and fails at once when Postgres
// answers with an error that waiting cannot fix.
func TestStartupWaitsForPostgres(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	// A port nothing listens on until the proxy starts on it.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	proxy := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), "pg", addr, u.Host)
	t.Cleanup(proxy.Stop)
	go func() {
		time.Sleep(1500 * time.Millisecond)
		if err := proxy.Start(); err != nil {
			t.Errorf("start proxy: %v", err)
		}
	}()
	late := *u
	late.Host = addr
	cfg := &config{DatabaseURL: late.String(), PublishTimeout: 10 * time.Second, StartupTimeout: 20 * time.Second}
	start := time.Now()
	pool, err := newPool(context.Background(), cfg, 2)
	if err != nil {
		t.Fatalf("newPool with Postgres up after 1.5 s: %v", err)
	}
	pool.Close()
	if waited := time.Since(start); waited < time.Second {
		t.Fatalf("connected after %v, before the proxy started", waited)
	}

	// No such database: Postgres says so, and waiting would not help.
	bad := *u
	bad.Path = "/no_such_database_relayd"
	cfg.DatabaseURL = bad.String()
	start = time.Now()
	if _, err := newPool(context.Background(), cfg, 2); err == nil || !strings.Contains(err.Error(), "no_such_database_relayd") {
		t.Fatalf("newPool to a missing database: %v, want Postgres's error", err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("a missing database took %v to report, want at once", waited)
	}

	// Nothing ever listens: after the timeout, the error is the last
	// real one, not the deadline's.
	l, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	never := *u
	never.Host = l.Addr().String()
	l.Close()
	cfg.DatabaseURL, cfg.StartupTimeout = never.String(), 1500*time.Millisecond
	if _, err := newPool(context.Background(), cfg, 2); err == nil || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("newPool with nothing listening: %v, want the refused connection", err)
	}
}

// Postgres starting up, shutting down or recovering (SQLSTATE class 57P)
// is worth waiting for; its other errors are not.
func TestStartingUp(t *testing.T) {
	for code, want := range map[string]bool{"57P03": true, "57P01": true, "57P02": true, "3D000": false, "28P01": false, "28000": false} {
		if got := startingUp(&pgconn.PgError{Code: code}); got != want {
			t.Errorf("startingUp(%s) = %v, want %v", code, got, want)
		}
	}
}

// A NATS server that refuses our credentials refuses them every time: the
// connect fails at once with the server's reason, not after
// RELAY_STARTUP_TIMEOUT of retrying (that is for a server not yet up).
func TestNATSAuthRefusalFailsAtOnce(t *testing.T) {
	t.Parallel()
	srv := testenv.NATSServer(t, &natsserver.Options{Authorization: "s3cret-token"})
	cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(map[string]string{
		"RELAY_DATABASE_URL": "postgres://unused", "RELAY_NATS_URL": "nats://wrong-token@" + srv.Addr().String(),
		"RELAY_STARTUP_TIMEOUT": "30s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	nc, err := connectNATS(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		nc.Close()
		t.Fatal("connected with the wrong token")
	}
	if took := time.Since(start); took > 5*time.Second || !strings.Contains(strings.ToLower(err.Error()), "authorization") || strings.Contains(err.Error(), "wrong-token") {
		t.Fatalf("after %v: %v; want an authorization error at once, without the token", took, err)
	}
}
