package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgproto3"
	natsserver "github.com/nats-io/nats-server/v2/server"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/testenv"
)

// A password with every character a URL gives a meaning to.
const hardPassword = "p@ss:w/rd?,#%+ &=é"

// passwordFile writes content to a file of the test's own and returns its
// path.
func passwordFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Each password file's password reaches its client raw, less one trailing
// newline: set, escaped, into every URL of a broker's list (as amqp091-go
// and nats.go read them back), and kept for pgx's config.
func TestPasswordFilesAreRead(t *testing.T) {
	for _, tc := range []struct {
		name    string
		set     map[string]string // "FILE:content" writes a file
		amqp    []string          // the URLs, as RELAY_AMQP_URL then splits
		nats    []string
		pg      string
		wantRaw string
	}{
		{name: "amqp", set: map[string]string{"RELAY_AMQP_URL": "amqp://relay@rabbit:5672/vhost", "RELAY_AMQP_PASSWORD_FILE": "FILE:" + hardPassword + "\n"},
			amqp: []string{"amqp://relay:p%40ss%3Aw%2Frd%3F%2C%23%25%2B%20%26%3D%C3%A9@rabbit:5672/vhost"}, wantRaw: hardPassword},
		{name: "amqp list", set: map[string]string{"RELAY_AMQP_URL": "amqp://relay@a:5672/, amqps://relay@b/vhost,", "RELAY_AMQP_PASSWORD_FILE": "FILE:Pa55,word\r\n"},
			amqp: []string{"amqp://relay:Pa55%2Cword@a:5672/", "amqps://relay:Pa55%2Cword@b/vhost"}, wantRaw: "Pa55,word"},
		{name: "one newline only", set: map[string]string{"RELAY_AMQP_URL": "amqp://relay@a/", "RELAY_AMQP_PASSWORD_FILE": "FILE:pw\n\n"},
			amqp: []string{"amqp://relay:pw%0A@a/"}, wantRaw: "pw\n"},
		{name: "no newline", set: map[string]string{"RELAY_AMQP_URL": "amqp://relay@a/", "RELAY_AMQP_PASSWORD_FILE": "FILE:pw"},
			amqp: []string{"amqp://relay:pw@a/"}, wantRaw: "pw"},
		{name: "nats list", set: map[string]string{"RELAY_NATS_URL": "relay@a:4222, tls://relay@b:4222,", "RELAY_NATS_PASSWORD_FILE": "FILE:" + hardPassword + "\n"},
			nats: []string{"nats://relay:p%40ss%3Aw%2Frd%3F%2C%23%25%2B%20%26%3D%C3%A9@a:4222", "tls://relay:p%40ss%3Aw%2Frd%3F%2C%23%25%2B%20%26%3D%C3%A9@b:4222"}, wantRaw: hardPassword},
		{name: "postgres multi-host", set: map[string]string{"RELAY_DATABASE_URL": "postgres://relay@pg1:5432,pg2:5432/app?target_session_attrs=read-write", "RELAY_DATABASE_PASSWORD_FILE": "FILE:" + hardPassword + "\n"},
			pg: hardPassword},
		{name: "postgres dsn", set: map[string]string{"RELAY_DATABASE_URL": "host=pg1,pg2 port=5432,5433 user=relay dbname=app", "RELAY_DATABASE_PASSWORD_FILE": "FILE:pw\r\n"},
			pg: "pw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := base()
			env["RELAY_DATABASE_URL"] = "postgres://relay@db.example:5432/app"
			for k, v := range tc.set {
				if content, ok := strings.CutPrefix(v, "FILE:"); ok {
					v = passwordFile(t, content)
				}
				env[k] = v
			}
			cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
			if err != nil {
				t.Fatal(err)
			}
			if tc.amqp != nil {
				got := amqpio.SplitURLs(cfg.AMQPURL)
				if strings.Join(got, " ") != strings.Join(tc.amqp, " ") {
					t.Fatalf("RELAY_AMQP_URL became %q, want %q", got, tc.amqp)
				}
				for _, u := range got {
					uri, err := amqp.ParseURI(u)
					if err != nil || uri.Password != tc.wantRaw || uri.Username != "relay" {
						t.Errorf("amqp091-go reads %s as user %q password %q (%v), want relay and %q", u, uri.Username, uri.Password, err, tc.wantRaw)
					}
				}
				if strings.Contains(redactAMQP(cfg.AMQPURL), "Pa55") || strings.Contains(redactAMQP(cfg.AMQPURL), "p%40ss") {
					t.Errorf("redacted: %s", redactAMQP(cfg.AMQPURL))
				}
			}
			if tc.nats != nil {
				got := natsURLs(cfg.NATSURL)
				if strings.Join(got, " ") != strings.Join(tc.nats, " ") {
					t.Fatalf("RELAY_NATS_URL became %q, want %q", got, tc.nats)
				}
				for _, s := range got {
					u, err := url.Parse(s) // as nats.go reads each server
					if pw, _ := u.User.Password(); err != nil || pw != tc.wantRaw || u.User.Username() != "relay" {
						t.Errorf("%s: user %q password %q (%v), want relay and %q", s, u.User.Username(), pw, err, tc.wantRaw)
					}
				}
				if r := redact(cfg.NATSURL); strings.Contains(r, "p%40ss") || strings.Count(r, "relay:xxxxx@") != len(got) {
					t.Errorf("redacted: %s", r)
				}
			}
			if cfg.databasePassword != tc.pg {
				t.Errorf("database password %q, want %q", cfg.databasePassword, tc.pg)
			}
		})
	}
}

// Every mistake is exit 2 and one line naming the variable, before any
// connection, and never the password.
func TestPasswordFileErrors(t *testing.T) {
	const secret = "s3cret-in-file"
	good, dir := passwordFile(t, secret+"\n"), t.TempDir()
	empty, newline := passwordFile(t, ""), passwordFile(t, "\r\n")
	noUserDB := map[string]string{"RELAY_DATABASE_URL": "postgres://db.example/app"}
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"RELAY_DATABASE_PASSWORD_FILE": "/nonexistent/pw"}, "RELAY_DATABASE_PASSWORD_FILE: cannot read /nonexistent/pw: no such file or directory"},
		{map[string]string{"RELAY_AMQP_PASSWORD_FILE": dir, "RELAY_AMQP_URL": "amqp://relay@h/"}, "RELAY_AMQP_PASSWORD_FILE: cannot read " + dir + ": is a directory"},
		{map[string]string{"RELAY_NATS_PASSWORD_FILE": empty, "RELAY_NATS_URL": "nats://relay@h:4222"}, "RELAY_NATS_PASSWORD_FILE: " + empty + " is empty"},
		{map[string]string{"RELAY_AMQP_PASSWORD_FILE": newline, "RELAY_AMQP_URL": "amqp://relay@h/"}, "RELAY_AMQP_PASSWORD_FILE: " + newline + " is empty"},
		// A password in the URL too: which one is meant?
		{map[string]string{"RELAY_DATABASE_PASSWORD_FILE": good, "RELAY_DATABASE_URL": "postgres://relay:s3cret@db/app"},
			"RELAY_DATABASE_PASSWORD_FILE: RELAY_DATABASE_URL holds a password already: remove it from the URL, or unset RELAY_DATABASE_PASSWORD_FILE"},
		{map[string]string{"RELAY_DATABASE_PASSWORD_FILE": good, "RELAY_DATABASE_URL": "postgres://relay@db/app?sslmode=disable&password=s3cret"}, "RELAY_DATABASE_PASSWORD_FILE: RELAY_DATABASE_URL holds a password already"},
		{map[string]string{"RELAY_DATABASE_PASSWORD_FILE": good, "RELAY_DATABASE_URL": "host=db user=relay password='s3cret'"}, "RELAY_DATABASE_PASSWORD_FILE: RELAY_DATABASE_URL holds a password already"},
		{map[string]string{"RELAY_AMQP_PASSWORD_FILE": good}, // the default URL holds guest's
			"RELAY_AMQP_PASSWORD_FILE: RELAY_AMQP_URL is unset, and its default (amqp://guest:xxxxx@127.0.0.1:5672/) holds guest's password: set it, naming the user"},
		{map[string]string{"RELAY_NATS_PASSWORD_FILE": good, "RELAY_NATS_URL": "nats://relay@h:4222", "RELAY_NATS_CREDS": good},
			"RELAY_NATS_PASSWORD_FILE: set beside RELAY_NATS_CREDS or RELAY_NATS_NKEY: authenticate one way, and empty the other"},
		{map[string]string{"RELAY_NATS_PASSWORD_FILE": good, "RELAY_NATS_URL": "nats://relay@a:4222,nats://relay:s3cret@b:4222"},
			"RELAY_NATS_PASSWORD_FILE: RELAY_NATS_URL server 2 of 2 (nats://relay:xxxxx@b:4222) holds a password already"},
		// No user for the password.
		{with(noUserDB, "RELAY_DATABASE_PASSWORD_FILE", good),
			"RELAY_DATABASE_PASSWORD_FILE: RELAY_DATABASE_URL names no user for the password: write one, as postgres://USER@host/db or user=USER"},
		{map[string]string{"RELAY_DATABASE_PASSWORD_FILE": good, "RELAY_DATABASE_URL": "host=db dbname=app"}, "RELAY_DATABASE_PASSWORD_FILE: RELAY_DATABASE_URL names no user"},
		{map[string]string{"RELAY_AMQP_PASSWORD_FILE": good, "RELAY_AMQP_URL": "amqp://relay@a/,amqp://b:5672/"},
			"RELAY_AMQP_PASSWORD_FILE: RELAY_AMQP_URL node 2 of 2 (amqp://b:5672/) names no user for the password: write one, as amqp://USER@host:5672/"},
		{map[string]string{"RELAY_NATS_PASSWORD_FILE": good}, // the default URL names none
			"RELAY_NATS_PASSWORD_FILE: RELAY_NATS_URL (nats://127.0.0.1:4222) names no user for the password: write one, as nats://USER@host:4222, or authenticate with RELAY_NATS_CREDS or RELAY_NATS_NKEY instead"},
		// The broker's URL is checked whatever the targets, as the
		// password goes into it.
		{map[string]string{"RELAY_TARGETS": "nats", "RELAY_AMQP_PASSWORD_FILE": good, "RELAY_AMQP_URL": "amqp://relay@h/my vhost"}, "RELAY_AMQP_URL: is not a URI"},
		{map[string]string{"RELAY_TARGETS": "amqp", "RELAY_NATS_PASSWORD_FILE": good, "RELAY_NATS_URL": "http://relay@h"}, "RELAY_NATS_URL: scheme"},
	} {
		env := base()
		env["RELAY_DATABASE_URL"] = "postgres://relay@db.example:5432/app"
		maps.Copy(env, tc.set)
		var stdout, stderr bytes.Buffer
		code := run([]string{"status"}, &stdout, &stderr, envconfig.MapLookuper(env))
		out := stdout.String() + stderr.String()
		if code != exitUsage || !strings.HasPrefix(out, "relayd: config: "+tc.want) || strings.Count(out, "\n") != 1 {
			t.Errorf("%v: exit %d, output %q; want exit 2 and one line starting %q", tc.set, code, out, tc.want)
		}
		if strings.Contains(out, "s3cret") {
			t.Errorf("%v: a password in the output: %q", tc.set, out)
		}
	}
}

// pgCredentials reads the user and the password a connection string sets
// as pgx does, whatever PGUSER and PGPASSWORD say.
func TestPgCredentials(t *testing.T) {
	t.Setenv("PGUSER", "from-env")
	t.Setenv("PGPASSWORD", "from-env")
	for _, tc := range []struct {
		s              string
		user, password bool
	}{
		{"postgres://relay@db/app", true, false},
		{"postgresql://relay:pw@db/app", true, true},
		{"postgres://relay:@db/app", true, false},
		{"postgres://db/app", false, false},
		{"postgres://db/app?user=relay", true, false},
		{"postgres://db/app?sslmode=disable&user=relay&password=pw", true, true},
		{"postgres://relay@pg1:5432,[::1]:5433/app?target_session_attrs=read-write", true, false},
		{"postgres://relay@db", true, false},
		{"postgres://db?user=relay", true, false},
		{"postgres://r%40lay@db/app", true, false},
		{"postgres://:pw@db/app", false, true},
		{"postgres://relay@db?password=a@b", true, true},
		{"postgres://db?password=a@b", false, true},
		{"postgres://relay@db#x@y", true, false},
		{"postgres://us@er:p@w@db/app", true, true},
		{"host=db dbname=app", false, false},
		{"host=db user=relay dbname=app", true, false},
		{"user = relay host=pg1,pg2", true, false},
		{"host=db user='re lay' password='p w'", true, true},
		{"host=db options='-c user=x password=y'", false, false},
		{"", false, false},
	} {
		if user, password := pgCredentials(tc.s); user != tc.user || password != tc.password {
			t.Errorf("pgCredentials(%q) = user %v password %v, want %v %v", tc.s, user, password, tc.user, tc.password)
		}
	}
}

// pgPasswordServer speaks just enough of Postgres's protocol to ask each
// client for its password in clear and refuse it; it sends what it got.
func pgPasswordServer(t *testing.T) (addr string, got <-chan string) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	passwords := make(chan string, 16)
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				b := pgproto3.NewBackend(conn, conn)
				for {
					msg, err := b.ReceiveStartupMessage()
					if err != nil {
						return
					}
					if _, ok := msg.(*pgproto3.StartupMessage); ok {
						break
					}
					conn.Write([]byte("N")) //nolint:errcheck // no TLS, no GSS: the client goes on or hangs up
				}
				b.Send(&pgproto3.AuthenticationCleartextPassword{})
				if b.Flush() != nil || b.SetAuthType(pgproto3.AuthTypeCleartextPassword) != nil {
					return
				}
				msg, err := b.Receive()
				if pm, ok := msg.(*pgproto3.PasswordMessage); ok && err == nil {
					passwords <- pm.Password
				}
				b.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01", Message: "password authentication failed"})
				b.Flush() //nolint:errcheck // the client may have gone
			}()
		}
	}()
	return l.Addr().String(), passwords
}

// relayd sends the file's password to Postgres — to the second host of a
// multi-host URL when the first does not answer — and never prints it. The
// shared Postgres trusts every local connection, so a server that asks for
// the password is the test's own.
func TestDatabasePasswordFileReachesPostgres(t *testing.T) {
	t.Parallel()
	addr, got := pgPasswordServer(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	_, deadPort, _ := net.SplitHostPort(dead)
	for _, dbURL := range []string{
		"postgres://relay@" + addr + "/app",
		"postgres://relay@" + dead + "," + addr + "/app?sslmode=prefer",
		"host=127.0.0.1,127.0.0.1 port=" + deadPort + "," + port + " user=relay dbname=app",
	} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"status", "--connect-timeout", "5s"}, &stdout, &stderr, envconfig.MapLookuper(map[string]string{
			"RELAY_DATABASE_URL": dbURL, "RELAY_DATABASE_PASSWORD_FILE": passwordFile(t, hardPassword+"\n"),
		}))
		want := "refused the connection: FATAL: password authentication failed (SQLSTATE 28P01)"
		if code != exitFailure || !strings.Contains(stderr.String(), want) || strings.Contains(stdout.String()+stderr.String(), "p@ss") {
			t.Errorf("%s: exit %d, output %q; want exit 1, %q and no password", dbURL, code, stdout.String()+stderr.String(), want)
		}
		select {
		case pw := <-got:
			if pw != hardPassword {
				t.Errorf("%s: Postgres got password %q, want %q", dbURL, pw, hardPassword)
			}
		default:
			t.Errorf("%s: Postgres was sent no password", dbURL)
		}
	}
}

// RabbitMQ takes the file's password for the URL's user; a wrong one is
// refused, naming the broker and not the password. The DSN's password file
// is not read by a command that does not connect to Postgres.
func TestAMQPPasswordFile(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ")
	}
	t.Parallel()
	u, err := url.Parse(testenv.AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	pw, ok := u.User.Password()
	if !ok {
		t.Skip("the test RabbitMQ's URL holds no password")
	}
	u.User = url.User(u.User.Username())
	for _, tc := range []struct {
		password string
		code     int
		want     string
	}{
		{pw + "\n", exitOK, "every exchange and stream the routes name exists"},
		{"wrong-" + pw + "\n", exitFailure, "relayd routes check: RabbitMQ at " + u.Host + " refused the connection: Exception (403)"},
	} {
		var stdout, stderr bytes.Buffer
		code := run([]string{"routes", "check", "--connect-timeout", "5s"}, &stdout, &stderr, envconfig.MapLookuper(map[string]string{
			"RELAY_TARGETS": "amqp", "RELAY_AMQP_EXCHANGE": "amq.topic",
			"RELAY_AMQP_URL": u.String(), "RELAY_AMQP_PASSWORD_FILE": passwordFile(t, tc.password),
			"RELAY_DATABASE_PASSWORD_FILE": "/nonexistent/pw",
		}))
		out := stdout.String() + stderr.String()
		if code != tc.code || !strings.Contains(out, tc.want) || strings.Contains(out, "wrong-") {
			t.Errorf("password file %q: exit %d, output %q; want exit %d and %q", tc.password, code, out, tc.code, tc.want)
		}
	}
}

// A NATS server with users takes the file's password for the user of every
// server in the list; a wrong one is refused at once, naming the servers.
func TestNATSPasswordFile(t *testing.T) {
	t.Parallel()
	srv := testenv.NATSServer(t, &natsserver.Options{Username: "relay", Password: hardPassword})
	addr := srv.Addr().String()
	list := "nats://relay@" + addr + ", relay@" + addr
	cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(map[string]string{
		"RELAY_DATABASE_URL": "postgres://unused", "RELAY_NATS_URL": list,
		"RELAY_NATS_PASSWORD_FILE": passwordFile(t, hardPassword+"\n"), "RELAY_STARTUP_TIMEOUT": "5s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := connectNATS(context.Background(), cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("connect with the file's password: %v", err)
	}
	if err := nc.Publish("relayd.test", nil); err != nil || nc.Flush() != nil {
		t.Fatalf("publish: %v", errors.Join(err, nc.Flush()))
	}
	nc.Close()

	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := run([]string{"routes", "check", "--connect-timeout", "30s"}, &stdout, &stderr, envconfig.MapLookuper(map[string]string{
		"RELAY_TARGETS": "nats", "RELAY_NATS_URL": list, "RELAY_NATS_PASSWORD_FILE": passwordFile(t, "wrong\n"),
	}))
	want := "relayd routes check: NATS at " + addr + "," + addr + " refused the connection: nats: Authorization Violation"
	if code != exitFailure || !strings.Contains(stderr.String(), want) || strings.Contains(stdout.String()+stderr.String(), "wrong") {
		t.Errorf("wrong password: exit %d, output %q; want exit 1 and %q", code, stdout.String()+stderr.String(), want)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("a refused password took %v to report, want at once", took)
	}
}

// Whatever the password, each broker's client reads it back from the URL
// whole, and the list still splits into its URLs.
func FuzzSetPassword(f *testing.F) {
	for _, s := range []string{hardPassword, "pw", "a,amqp://b", ",nats://x@y", "%zz", "\x00\xff", "user:pw@host"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		if pw == "" {
			return
		}
		amqpURLs, err := setPassword("RELAY_AMQP", "node", []string{"amqp://relay@a:5672/v", "amqps://relay@b/"}, pw, "")
		if err != nil {
			t.Fatal(err)
		}
		split := amqpio.SplitURLs(strings.Join(amqpURLs, ","))
		if len(split) != 2 {
			t.Fatalf("%q: RELAY_AMQP_URL splits into %q", pw, split)
		}
		for _, u := range split {
			if uri, err := amqp.ParseURI(u); err != nil || uri.Password != pw || uri.Username != "relay" {
				t.Fatalf("%q: amqp091-go reads %s as %q %q (%v)", pw, u, uri.Username, uri.Password, err)
			}
		}
		natsList, err := setPassword("RELAY_NATS", "server", []string{"nats://relay@a:4222", "tls://relay@b:4222"}, pw, "")
		if err != nil {
			t.Fatal(err)
		}
		servers := natsURLs(strings.Join(natsList, ","))
		if len(servers) != 2 {
			t.Fatalf("%q: RELAY_NATS_URL splits into %q", pw, servers)
		}
		for _, s := range servers {
			u, err := url.Parse(s)
			if got, _ := u.User.Password(); err != nil || got != pw {
				t.Fatalf("%q: nats.go reads %s as %q (%v)", pw, s, got, err)
			}
		}
		if r := redact(strings.Join(natsList, ",")); r != "nats://relay:xxxxx@a:4222,tls://relay:xxxxx@b:4222" {
			t.Fatalf("%q: redacted as %s", pw, r)
		}
	})
}
