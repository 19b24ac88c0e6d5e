package main

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/testenv"
)

// A multi-host RELAY_DATABASE_URL (a primary and its standbys, the one that
// takes writes picked by target_session_attrs) is accepted, and its
// password is never in an error.
func TestConfigDatabaseURLMultiHost(t *testing.T) {
	for _, tc := range []struct {
		url  string
		want string // "": accepted; else in the error
	}{
		{"postgres://relay:s3cret@pg1:5432,pg2:5432/app?target_session_attrs=read-write", ""},
		{"postgres://relay:s3cret@pg1,pg2,pg3/app?target_session_attrs=read-write&sslmode=disable", ""},
		{"postgres://relay:s3cret@pg1:5432,pg2/app?target_session_attrs=primary", ""},
		{"postgres://relay:s3cret@[::1]:5432,[::1]:5433/app?target_session_attrs=read-write", ""},
		{"host=pg1,pg2 port=5432,5433 user=relay password=s3cret dbname=app target_session_attrs=read-write", ""},
		{"postgres://relay:s3cret@pg1:5432,pg2:5432/app?target_session_attrs=whichever", "RELAY_DATABASE_URL"},
		{"postgres://relay:s3cret@pg1:5432,pg2:port/app", "RELAY_DATABASE_URL"},
		{"host=pg1,pg2 port=5432,5433,5434 user=relay password=s3cret", "RELAY_DATABASE_URL"},
	} {
		_, err := loadConfig(context.Background(), envconfig.MapLookuper(with(base(), "RELAY_DATABASE_URL", tc.url)))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want accepted", tc.url, err)
		case tc.want != "" && err == nil:
			t.Errorf("%s: accepted, want an error naming %s", tc.url, tc.want)
		case err != nil && (!strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "s3cret")):
			t.Errorf("%s: error %q: want it to name %s, without the password", tc.url, err, tc.want)
		}
	}
}

// The start-up wait names every host of a multi-host URL, in the order pgx
// tries them, each once, and no password.
func TestPostgresForLogMultiHost(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"postgres://relay:s3cret@db:5432/app", "postgres://relay@db:5432/app"},
		{"postgres://relay:s3cret@pg1:5432,pg2:5433/app?target_session_attrs=read-write&sslmode=disable",
			"postgres://relay@pg1:5432,pg2:5433/app"},
		// sslmode=prefer (the default): each host with TLS, then without.
		{"postgres://relay:s3cret@pg1,pg2,pg3/app?target_session_attrs=read-write",
			"postgres://relay@pg1:5432,pg2:5432,pg3:5432/app"},
		{"postgres://relay:s3cret@[::1]:5432,127.0.0.1:5433/app?sslmode=disable",
			"postgres://relay@[::1]:5432,127.0.0.1:5433/app"},
		{"host=pg1,pg2 port=5432,5433 user=relay password=s3cret dbname=app sslmode=disable",
			"postgres://relay@pg1:5432,pg2:5433/app"},
		{"host=/run/postgresql user=relay dbname=app", "postgres://relay@/run/postgresql/app"},
	} {
		pc, err := pgxpool.ParseConfig(tc.url)
		if err != nil {
			t.Fatalf("%s: %v", tc.url, err)
		}
		if got := postgresForLog(pc); got != tc.want {
			t.Errorf("postgresForLog(%s) = %q, want %q", tc.url, got, tc.want)
		}
	}
}

// redactURL on a multi-host URL: the password replaced, every host kept; a
// host list with a port that is not a number (a piece of a password) is not
// printed.
func TestRedactMultiHost(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"postgres://relay:s3cret@pg1:5432,pg2:5432/app?target_session_attrs=read-write",
			"postgres://relay:xxxxx@pg1:5432,pg2:5432/app?target_session_attrs=read-write"},
		{"postgres://relay:s3cret@pg1:5432,pg2/app", "postgres://relay:xxxxx@pg1:5432,pg2/app"},
		{"postgres://relay:s3cret@pg1,pg2:5433/app", "postgres://relay:xxxxx@pg1,pg2:5433/app"},
		{"postgres://relay@pg1:5432,pg2:5433/app", "postgres://relay@pg1:5432,pg2:5433/app"},
		{"postgres://relay:s3cret@[::1]:5432,[::1]:5433/app", "postgres://relay:xxxxx@[::1]:5432,[::1]:5433/app"},
		{"postgres://pg1:5432,pg2:s3cret/app", "(unparseable URL)"},
	} {
		if got := redactURL(tc.in); got != tc.want {
			t.Errorf("redactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// A first host that accepts the connection and never answers (a server
// powered off behind a load balancer, a cut network) does not keep relayd
// from the next host of a multi-host URL.
func TestMultiHostSkipsSilentHost(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres")
	}
	t.Parallel()
	u, err := url.Parse(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	multi := *u
	multi.Host = silent.Addr().String() + "," + u.Host
	q := multi.Query()
	q.Set("target_session_attrs", "read-write")
	multi.RawQuery = q.Encode()
	cfg := &config{DatabaseURL: multi.String(), PublishTimeout: 10 * time.Second, StartupTimeout: 20 * time.Second}
	start := time.Now()
	pool, err := newPool(context.Background(), cfg, 2)
	if err != nil {
		t.Fatalf("newPool past a silent first host: %v", err)
	}
	pool.Close()
	if took := time.Since(start); took > 2*hostConnectTimeout {
		t.Errorf("connected past a silent first host after %v, want within %v", took, 2*hostConnectTimeout)
	}
}
