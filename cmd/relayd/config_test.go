package main

import (
	"bytes"
	"context"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/relay"
)

func base() map[string]string {
	return map[string]string{"RELAY_DATABASE_URL": "postgres://relay:s3cret@db.example:5432/app"}
}

// RELAY_TARGETS pins the phase; unset or empty, the relay follows the
// table's and starts with both targets.
func TestTargetsPinThePhase(t *testing.T) {
	for _, tc := range []struct {
		set    *string
		want   []relay.Target
		pinned bool
	}{
		{nil, relay.Targets, false},
		{ptr(""), relay.Targets, false},
		{ptr("amqp"), []relay.Target{relay.TargetAMQP}, true},
		{ptr("nats,amqp"), relay.Targets, true},
		{ptr("nats"), []relay.Target{relay.TargetNATS}, true},
	} {
		env := base()
		if tc.set != nil {
			env["RELAY_TARGETS"] = *tc.set
		}
		cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cfg.targets, tc.want) || cfg.pinned != tc.pinned {
			t.Errorf("RELAY_TARGETS %v: targets %v pinned %v, want %v pinned %v", tc.set, cfg.targets, cfg.pinned, tc.want, tc.pinned)
		}
	}
}

func ptr[T any](v T) *T { return &v }

func TestConfigDefaults(t *testing.T) {
	cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(base()))
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.targets) != 2 || cfg.targets[0] != relay.TargetAMQP || cfg.targets[1] != relay.TargetNATS || cfg.pinned {
		t.Errorf("targets %v pinned %v, want both brokers, following the table's phase, by default", cfg.targets, cfg.pinned)
	}
	if cfg.table.String() != "outbox" || cfg.NATSStream != "OUTBOX" || cfg.AMQPExchange != "outbox" ||
		cfg.NATSSubjectPrefix != "outbox." || cfg.PublishTimeout != 10*time.Second || cfg.MetricsAddr != "127.0.0.1:9090" {
		t.Errorf("unexpected defaults: %+v", cfg)
	}
}

// Every bad value: an error naming the variable, on one line, without the
// database password.
func TestConfigErrorsNameTheVariable(t *testing.T) {
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"RELAY_DATABASE_URL": ""}, "RELAY_DATABASE_URL"},
		{map[string]string{"RELAY_TARGETS": "bogus"}, "RELAY_TARGETS"},
		{map[string]string{"RELAY_TARGETS": "amqp,amqp"}, "RELAY_TARGETS"},
		{map[string]string{"RELAY_OUTBOX_TABLE": "public.Outbox; drop"}, "RELAY_OUTBOX_TABLE"},
		{map[string]string{"RELAY_NATS_URL": "http://x"}, "RELAY_NATS_URL"},
		{map[string]string{"RELAY_AMQP_URL": "amqp://"}, "RELAY_AMQP_URL"},
		{map[string]string{"RELAY_NATS_SUBJECT_PREFIX": "a.*."}, "RELAY_NATS_SUBJECT_PREFIX"},
		{map[string]string{"RELAY_NATS_SUBJECT_PREFIX": "events"}, "RELAY_NATS_SUBJECT_PREFIX"},
		{map[string]string{"RELAY_NATS_STREAM": "a.b"}, "RELAY_NATS_STREAM"},
		{map[string]string{"RELAY_NATS_STREAM": "", "RELAY_PROVISION": "true"}, "RELAY_NATS_STREAM: is empty"},
		{map[string]string{"RELAY_ROUTES": "/nonexistent/routes.yaml"}, "RELAY_ROUTES: open /nonexistent/routes.yaml"},
		{map[string]string{"RELAY_ROUTES": routesFile(t, "routes: [{topic: 'a.*', amqp: {routing_key: '{2}'}}]")}, "RELAY_ROUTES: /"},
		{map[string]string{"RELAY_ROUTES": routesFile(t, "routes: [{topic: a, nats: {stream: 'A.B'}}]")}, "RELAY_ROUTES: /"},
		{map[string]string{"RELAY_AMQP_EXCHANGE": ""}, "RELAY_AMQP_EXCHANGE"},
		{map[string]string{"RELAY_BATCH_SIZE": "0"}, "RELAY_BATCH_SIZE"},
		{map[string]string{"RELAY_BATCH_SIZE": "1"}, "RELAY_BATCH_SIZE"},
		{map[string]string{"RELAY_BATCH_SIZE": "many"}, "RELAY_BATCH_SIZE"},
		{map[string]string{"RELAY_WORKERS": "1000"}, "RELAY_WORKERS"},
		{map[string]string{"RELAY_PUBLISH_TIMEOUT": "10"}, "RELAY_PUBLISH_TIMEOUT"},
		{map[string]string{"RELAY_PUBLISH_TIMEOUT": "-1s"}, "RELAY_PUBLISH_TIMEOUT"},
		{map[string]string{"RELAY_RETENTION": "0s"}, "RELAY_RETENTION"},
		{map[string]string{"RELAY_PROVISION": "maybe"}, "RELAY_PROVISION"},
		{map[string]string{"RELAY_METRICS_ADDR": "9090"}, "RELAY_METRICS_ADDR"},
		{map[string]string{"RELAY_LOG_LEVEL": "loud"}, "RELAY_LOG_LEVEL"},
		{map[string]string{"RELAY_LOG_FORMAT": "xml"}, "RELAY_LOG_FORMAT"},
		// Set but empty: not the default, not zero.
		{map[string]string{"RELAY_DATABASE_URL": " "}, "RELAY_DATABASE_URL: is set but empty"},
		{map[string]string{"RELAY_MAX_ATTEMPTS": ""}, "RELAY_MAX_ATTEMPTS: is set but empty"},
		{map[string]string{"RELAY_PUBLISH_TIMEOUT": ""}, "RELAY_PUBLISH_TIMEOUT: is set but empty"},
		{map[string]string{"RELAY_METRICS_ADDR": ":99999"}, "RELAY_METRICS_ADDR"},
		{map[string]string{"RELAY_METRICS_ADDR": "localhost:http"}, "RELAY_METRICS_ADDR"},
		// amqp091-go refuses these when it dials: a space in the vhost, a
		// bad heartbeat.
		{map[string]string{"RELAY_AMQP_URL": "amqp://u:s3cret@h/my vhost"}, "RELAY_AMQP_URL"},
		{map[string]string{"RELAY_AMQP_URL": "amqp://u:s3cret@h/?heartbeat=x"}, "RELAY_AMQP_URL"},
		{map[string]string{"RELAY_NATS_URL": "nats://a:4222,http://b"}, "RELAY_NATS_URL"},
		{map[string]string{"RELAY_NATS_URL": " , "}, "RELAY_NATS_URL: names no server"},
		// A RabbitMQ node list: the bad node named by its place and
		// redacted URL.
		{map[string]string{"RELAY_AMQP_URL": "amqp://u:s3cret@a/,amqp://u:s3cret@b/my vhost"}, "RELAY_AMQP_URL: node 2 of 2 (amqp://u:xxxxx@b/my vhost): is not a URI"},
		{map[string]string{"RELAY_AMQP_URL": "amqp://u:s3cret@a/, amqps://u:s3cret@/, amqp://c/"}, "RELAY_AMQP_URL: node 2 of 3 (amqps://u:xxxxx@/): has no host"},
		{map[string]string{"RELAY_AMQP_URL": "amqp://u:s3cret@a:5672/,amqp://u:s3cret@b:x/"}, "RELAY_AMQP_URL: node 2 of 2 ((unparseable URL)): is not a valid URL"},
		{map[string]string{"RELAY_AMQP_URL": " , "}, "RELAY_AMQP_URL: names no node"},
		{map[string]string{"RELAY_AMQP_URL": "rabbit-0:5672,amqp://rabbit-1:5672/"}, "RELAY_AMQP_URL: node 1 of 2 ((unparseable URL)): scheme"},
	} {
		env := base()
		for k, v := range tc.set {
			if v == "" && k == "RELAY_DATABASE_URL" {
				delete(env, k)
				continue
			}
			env[k] = v
		}
		_, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
		if err == nil {
			t.Errorf("%v: accepted", tc.set)
			continue
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, tc.want) || strings.Contains(msg, "\n") || strings.Contains(msg, "s3cret") {
			t.Errorf("%v: error %q, want one line starting with %s and no password", tc.set, msg, tc.want)
		}
	}
}

// A target that is off needs no settings of its own.
func TestConfigSkipsDisabledTarget(t *testing.T) {
	env := base()
	env["RELAY_TARGETS"] = "amqp"
	env["RELAY_NATS_URL"] = "garbage"
	if _, err := loadConfig(context.Background(), envconfig.MapLookuper(env)); err != nil {
		t.Fatalf("nats settings checked with nats disabled: %v", err)
	}
}

// Values nats.go and the runtime accept are accepted; an empty value that
// means something keeps its meaning.
func TestConfigAccepts(t *testing.T) {
	for _, set := range []map[string]string{
		{"RELAY_NATS_URL": "nats://a:4222, nats://b:4222"},
		{"RELAY_NATS_URL": "nats-0:4222,nats-1:4222"},
		{"RELAY_NATS_URL": "nats://a:4222,"},
		{"RELAY_AMQP_URL": "amqp://u:pw@rabbit-0:5672/, amqp://u:pw@rabbit-1:5672/,amqps://u:pw@rabbit-2/vhost"},
		{"RELAY_AMQP_URL": "amqp://u:pw@rabbit-0:5672/,"},
		{"RELAY_AMQP_URL": "amqp://relay:Pa55,word@rabbit:5672/"}, // a ',' in a password is the password's
		{"RELAY_METRICS_ADDR": ""},
		{"RELAY_NATS_SUBJECT_PREFIX": ""},
		{"RELAY_NATS_STREAM": ""},
		{"RELAY_ROUTES": routesFile(t, "routes: [{topic: billing.*, amqp: {exchange: 'Billing:{1}', routing_key: ''}}]")},
		{"RELAY_NATS_CREDS": ""},
		{"RELAY_MAX_ATTEMPTS": "0"},
	} {
		env := base()
		maps.Copy(env, set)
		if _, err := loadConfig(context.Background(), envconfig.MapLookuper(env)); err != nil {
			t.Errorf("%v: %v", set, err)
		}
	}
}

func TestRunExitCodes(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  map[string]string
		code int
		out  string
	}{
		{nil, nil, exitUsage, "Usage"},
		{[]string{"frobnicate"}, nil, exitUsage, "unknown command"},
		{[]string{"version"}, nil, exitOK, "relayd dev"},
		{[]string{"run", "--help"}, nil, exitOK, "Usage: relayd run"},
		{[]string{"migrate", "--help"}, nil, exitOK, "Usage: relayd migrate"},
		{[]string{"migrate", "sideways"}, base(), exitUsage, "unknown action"},
		{[]string{"migrate", "down-to", "5"}, base(), exitUsage, "down-to wants one version, 12 or later"},
		{[]string{"migrate", "down-to"}, base(), exitUsage, "down-to wants one version"},
		{[]string{"run", "--bogus"}, base(), exitUsage, "flag provided but not defined"},
		{[]string{"run"}, map[string]string{"RELAY_TARGETS": "bogus", "RELAY_DATABASE_URL": "postgres://x"}, exitUsage, "RELAY_TARGETS"},
		{[]string{"run"}, map[string]string{}, exitUsage, "RELAY_DATABASE_URL"},
		{[]string{"run"}, map[string]string{"RELAY_DATABASE_URL": ""}, exitUsage, "RELAY_DATABASE_URL: is set but empty"},
		{[]string{"backfill", "--queue", "q"}, with(base(), "RELAY_BACKFILL_LIMIT", ""), exitUsage, "RELAY_BACKFILL_LIMIT: is set but empty"},
		{[]string{"backfill", "--queue", "q"}, with(base(), "RELAY_AMQP_URL", "amqp://u:pw@h/?heartbeat=x"), exitUsage, "RELAY_AMQP_URL: is not a URI"},
		{[]string{"migrate", "--inbox", "Bad-Name"}, base(), exitUsage, "--inbox \"Bad-Name\" is not a valid table name"},
		{[]string{"run"}, with(base(), "RELAY_PUBLISH_TIMEOUT", "30s"), exitUsage, "RELAY_SHUTDOWN_TIMEOUT: 30s must exceed RELAY_PUBLISH_TIMEOUT"},
		// Only run waits for in-flight batches: backfill takes the same
		// publish timeout (and fails later, here, on its missing --queue).
		{[]string{"backfill"}, with(base(), "RELAY_PUBLISH_TIMEOUT", "30s"), exitUsage, "--queue"},
		// backfill's own settings: exit 2, naming the flag and variable,
		// before any connection is tried.
		{[]string{"backfill", "--queue", "q", "--prefetch", "70000"}, base(), exitUsage, "--prefetch (or RELAY_BACKFILL_PREFETCH): 70000 is out of range"},
		{[]string{"backfill", "--queue", "q"}, with(base(), "RELAY_BACKFILL_PREFETCH", "-1"), exitUsage, "--prefetch (or RELAY_BACKFILL_PREFETCH): -1 is out of range"},
		{[]string{"backfill", "--queue", "q"}, with(base(), "RELAY_BACKFILL_PREFETCH", "abc"), exitUsage, `RELAY_BACKFILL_PREFETCH="abc": want a whole number`},
		{[]string{"backfill", "--queue", "q", "--limit", "-1"}, base(), exitUsage, "--limit (or RELAY_BACKFILL_LIMIT): -1 is out of range"},
		{[]string{"backfill", "--queue", "q", "--rate", "-1"}, base(), exitUsage, "--rate (or RELAY_BACKFILL_RATE): -1 is out of range"},
		// A bad AMQP URL, checked even with the amqp target off, and not
		// echoed (it holds the password).
		{[]string{"backfill", "--queue", "q"}, with(with(base(), "RELAY_TARGETS", "nats"), "RELAY_AMQP_URL", "amqp://u:pa%zzword@h/"), exitUsage, "RELAY_AMQP_URL: is not a valid URL"},
		{[]string{"cutover", "check", "--consumer", "c", "--queue", "q"}, with(with(base(), "RELAY_TARGETS", "nats"), "RELAY_AMQP_URL", "amqp://u:pa%zzword@h/"), exitUsage, "RELAY_AMQP_URL: is not a valid URL"},
	} {
		var stdout, stderr bytes.Buffer
		code := run(tc.args, &stdout, &stderr, envconfig.MapLookuper(tc.env))
		if code != tc.code || !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("relayd %v: exit %d, output %q; want exit %d and %q", tc.args, code, stdout.String()+stderr.String(), tc.code, tc.out)
		}
		if strings.Contains(stdout.String()+stderr.String(), "pa%zzword") {
			t.Errorf("relayd %v: the password is in the output: %q", tc.args, stderr.String())
		}
		if tc.code == exitUsage && len(tc.args) > 0 && tc.args[0] != "migrate" && tc.env != nil {
			if lines := strings.Count(strings.TrimSpace(stderr.String()), "\n"); lines != 0 {
				t.Errorf("relayd %v: %d lines on stderr, want 1", tc.args, lines+1)
			}
		}
	}
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"amqp://guest:hunter2@rabbit:5672/": "amqp://guest:xxxxx@rabbit:5672/",
		"amqp://guest@rabbit:5672/":         "amqp://guest@rabbit:5672/",
		// A NATS server list: every password; a token alone.
		"nats://u:pw1@a:4222,nats://u:pw2@b:4222": "nats://u:xxxxx@a:4222,nats://u:xxxxx@b:4222",
		"nats://s3cr3t@nats:4222":                 "nats://xxxxx@nats:4222",
		"tls://s3cr3t@nats:4222, nats://b:4222":   "tls://xxxxx@nats:4222,nats://b:4222",
		"nats://127.0.0.1:4222":                   "nats://127.0.0.1:4222",
		"nats://a:4222,u:pw@b:4222":               "nats://a:4222,nats://u:xxxxx@b:4222",
		"amqp://u:pa%zz@h/":                       "amqp://u:xxxxx@h/",
		// A token or password with '/', '?', '#' or '@' in it, unescaped:
		// url.Parse reads the first three as the path, and the user part
		// ends at the last '@'.
		"nats://Zm9v/YmFy@nats:4222":   "nats://xxxxx@nats:4222",
		"nats://tok?en@nats:4222":      "nats://xxxxx@nats:4222",
		"tls://u:p#w@nats:4222":        "tls://u:xxxxx@nats:4222",
		"amqp://u:p/w@d@rabbit/vhost":  "amqp://u:xxxxx@rabbit/vhost",
		"nats:4222, s3cr3t@nats2:4222": "nats://nats:4222,nats://xxxxx@nats2:4222",
	} {
		if got := redact(in); got != want {
			t.Errorf("redact(%q) = %q, want %q", in, got, want)
		}
	}
	// One URL (RabbitMQ's): a ',' in the password is the password's.
	for in, want := range map[string]string{
		"amqp://relay:Pa55,word@rabbit:5672/": "amqp://relay:xxxxx@rabbit:5672/",
		"amqps://relay@rabbit/vhost":          "amqps://relay@rabbit/vhost",
		"rabbit:5672":                         "(unparseable URL)",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
	// A RabbitMQ node list: split only where a URL follows a ',', so a ','
	// in a password stays the password's.
	for in, want := range map[string]string{
		"amqp://guest:guest@127.0.0.1:5672/":                       "amqp://guest:xxxxx@127.0.0.1:5672/",
		"amqp://u:pw1@a:5672/,amqp://u:pw2@b:5673/":                "amqp://u:xxxxx@a:5672/,amqp://u:xxxxx@b:5673/",
		" amqp://u:pw1@a/ , amqps://b/vhost, ":                     "amqp://u:xxxxx@a/,amqps://b/vhost",
		"amqp://relay:Pa55,word@a:5672/,amqp://relay:Pa55,word@b/": "amqp://relay:xxxxx@a:5672/,amqp://relay:xxxxx@b/",
		"amqp://u:p/w@d@a/vhost,amqp://u:p?w#x@b/":                 "amqp://u:xxxxx@a/vhost,amqp://u:xxxxx@b/",
		"rabbit:5672": "(unparseable URL)",
		"":            "(unparseable URL)",
	} {
		if got := redactAMQP(in); got != want {
			t.Errorf("redactAMQP(%q) = %q, want %q", in, got, want)
		}
	}
	// A NATS password with a ',' (nats.go splits the list there): no piece
	// of it is printed.
	if got := redact("nats://u:pw1,pw2@h:4222"); strings.Contains(got, "pw1") || strings.Contains(got, "pw2") {
		t.Errorf("redact = %q: a piece of the password", got)
	}
}

func with(env map[string]string, k, v string) map[string]string {
	env[k] = v
	return env
}

func FuzzConfigTargets(f *testing.F) {
	for _, s := range []string{"amqp", "nats", "amqp,nats", "bogus", "", ",", "amqp,,nats"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		env := base()
		env["RELAY_TARGETS"] = s
		cfg, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
		if err != nil {
			if !strings.HasPrefix(err.Error(), "RELAY_") || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error %q is not one line naming a variable", err)
			}
			return
		}
		if len(cfg.targets) == 0 || len(cfg.targets) > 2 {
			t.Fatalf("accepted %q as %v", s, cfg.targets)
		}
	})
}

// Every backfill flag reads its default from RELAY_BACKFILL_<FLAG>, as the
// help and docs/configuration.md say: a job that sets RELAY_BACKFILL_DRY_RUN=true must
// not move a message. The help shows each flag's default, so it shows
// whether the variable was read.
func TestBackfillFlagsReadTheirVariables(t *testing.T) {
	var help bytes.Buffer
	if code := run([]string{"backfill", "-h"}, &help, &help, envconfig.MapLookuper(nil)); code != exitOK {
		t.Fatalf("backfill -h: exit %d", code)
	}
	values := map[string]string{"bool": "true", "string": "x-set", "int": "7", "float": "7.5"}
	flags := 0
	for line := range strings.Lines(help.String()) {
		fields := strings.Fields(line)
		if len(fields) == 0 || !strings.HasPrefix(line, "  -") {
			continue
		}
		flags++
		name, typ := strings.TrimPrefix(fields[0], "--"), "bool"
		if len(fields) > 1 {
			typ = fields[1]
		}
		v, ok := values[typ]
		if !ok {
			t.Fatalf("flag -%s of type %s: no test value", name, typ)
		}
		if name == "subject-map" {
			v = "a.=b."
		}
		envName := "RELAY_BACKFILL_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		var out bytes.Buffer
		run([]string{"backfill", "-h"}, &out, &out, envconfig.MapLookuper(map[string]string{envName: v}))
		want := "(default " + v + ")"
		if typ == "string" {
			want = "(default \"" + v + "\")"
		}
		var got string
		for l := range strings.Lines(out.String()) {
			if strings.HasPrefix(l, "  --"+name+" ") || strings.TrimSpace(l) == "--"+name {
				got = l
			}
		}
		// The usage text is on the line after the flag's name.
		if i := strings.Index(out.String(), got); got == "" || !strings.Contains(strings.SplitN(out.String()[i:], "\n", 3)[1], want) {
			t.Errorf("%s=%s: -%s's default is not %s:\n%s", envName, v, name, want, out.String())
		}
	}
	if flags < 10 {
		t.Errorf("found %d flags in the help, want the 10 it has:\n%s", flags, help.String())
	}
}

// The files the clients load are loaded at start: a directory, a file with
// no certificate, a key that is not the certificate's, a seed or a
// credentials file that is not one — each a config error naming the
// variable, not an exit 1 at the first connect (or after
// RELAY_STARTUP_TIMEOUT of retries).
func TestConfigFilesAreLoaded(t *testing.T) {
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.pem")
	if err := os.WriteFile(junk, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		set  map[string]string
		want string
	}{
		{map[string]string{"RELAY_NATS_CA": dir}, "RELAY_NATS_CA: cannot read"},
		{map[string]string{"RELAY_NATS_CA": junk}, "RELAY_NATS_CA: no PEM certificate"},
		{map[string]string{"RELAY_AMQP_CA": junk}, "RELAY_AMQP_CA: no PEM certificate"},
		{map[string]string{"RELAY_AMQP_CERT": junk, "RELAY_AMQP_KEY": junk}, "RELAY_AMQP_CERT: "},
		{map[string]string{"RELAY_NATS_CERT": junk, "RELAY_NATS_KEY": junk}, "RELAY_NATS_CERT: "},
		{map[string]string{"RELAY_NATS_NKEY": junk}, "RELAY_NATS_NKEY: "},
		{map[string]string{"RELAY_NATS_CREDS": junk}, "RELAY_NATS_CREDS: "},
	} {
		env := base()
		maps.Copy(env, tc.set)
		_, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
		if err == nil || !strings.HasPrefix(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%v: %v, want one line starting %q", tc.set, err, tc.want)
		}
	}
}

// routesFile writes a routes file for a config test and returns its path.
func routesFile(t *testing.T, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
