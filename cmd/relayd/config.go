package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// config is relayd's whole configuration, read from RELAY_* variables.
// Tunables left at zero take the relay package's defaults.
type config struct {
	DatabaseURL string `env:"RELAY_DATABASE_URL, required"`
	NATSURL     string `env:"RELAY_NATS_URL, default=nats://127.0.0.1:4222"`
	NATSCreds   string `env:"RELAY_NATS_CREDS"`
	NATSNKey    string `env:"RELAY_NATS_NKEY"`
	NATSCA      string `env:"RELAY_NATS_CA"`
	NATSCert    string `env:"RELAY_NATS_CERT"`
	NATSKey     string `env:"RELAY_NATS_KEY"`
	AMQPURL     string `env:"RELAY_AMQP_URL, default=amqp://guest:guest@127.0.0.1:5672/"`
	AMQPCA      string `env:"RELAY_AMQP_CA"`
	AMQPCert    string `env:"RELAY_AMQP_CERT"`
	AMQPKey     string `env:"RELAY_AMQP_KEY"`

	Targets           string        `env:"RELAY_TARGETS, default=amqp,nats"`
	NATSStream        string        `env:"RELAY_NATS_STREAM, default=OUTBOX"`
	NATSSubjectPrefix string        `env:"RELAY_NATS_SUBJECT_PREFIX, default=outbox."`
	NATSDupWindow     time.Duration `env:"RELAY_NATS_DUPLICATE_WINDOW, default=2m"`
	AMQPExchange      string        `env:"RELAY_AMQP_EXCHANGE, default=outbox"`
	OutboxTable       string        `env:"RELAY_OUTBOX_TABLE, default=outbox"`
	MetricsAddr       string        `env:"RELAY_METRICS_ADDR, default=127.0.0.1:9090"`
	PProf             bool          `env:"RELAY_PPROF, default=false"`
	Provision         bool          `env:"RELAY_PROVISION, default=false"`

	BatchSize      int           `env:"RELAY_BATCH_SIZE, default=500"`
	Workers        int           `env:"RELAY_WORKERS, default=8"`
	PublishTimeout time.Duration `env:"RELAY_PUBLISH_TIMEOUT, default=10s"`
	PollInterval   time.Duration `env:"RELAY_POLL_INTERVAL, default=1s"`
	Retention      time.Duration `env:"RELAY_RETENTION, default=24h"`
	MaxAttempts    int           `env:"RELAY_MAX_ATTEMPTS, default=20"`
	SkipParked     bool          `env:"RELAY_SKIP_PARKED_KEYS, default=false"`
	RetryMin       time.Duration `env:"RELAY_RETRY_MIN, default=1s"`
	RetryMax       time.Duration `env:"RELAY_RETRY_MAX, default=5m"`
	StatsInterval  time.Duration `env:"RELAY_STATS_INTERVAL, default=5s"`
	StartupTimeout time.Duration `env:"RELAY_STARTUP_TIMEOUT, default=30s"`
	ShutdownGrace  time.Duration `env:"RELAY_SHUTDOWN_TIMEOUT, default=30s"`

	LogLevel  string `env:"RELAY_LOG_LEVEL, default=info"`
	LogFormat string `env:"RELAY_LOG_FORMAT, default=text"`

	// Derived by validate.
	table    schema.Table
	targets  []relay.Target
	logLevel slog.Level
}

// configError is a configuration problem: relayd exits 2 with its message.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

func badVar(name, format string, args ...any) error {
	return &configError{msg: name + ": " + fmt.Sprintf(format, args...)}
}

// loadConfig reads the configuration through l (the process environment in
// production, a map in tests) and validates it.
func loadConfig(ctx context.Context, l envconfig.Lookuper) (*config, error) {
	var c config
	if err := noEmpty[config](l); err != nil {
		return nil, err
	}
	if err := envconfig.ProcessWith(ctx, &envconfig.Config{Target: &c, Lookuper: l}); err != nil {
		return nil, envError[config](err)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// emptyMeans are the variables with a default whose empty value is a
// setting of its own: no metrics listener; subjects without a prefix.
var emptyMeans = map[string]bool{"RELAY_METRICS_ADDR": true, "RELAY_NATS_SUBJECT_PREFIX": true}

// noEmpty refuses a variable of T that is required or has a default, set
// to nothing: go-envconfig takes "" as the value, so that an empty
// RELAY_MAX_ATTEMPTS (a compose file's unset ${VAR}) would mean 0, never
// park, and an empty RELAY_DATABASE_URL libpq's defaults — whatever PGHOST
// names.
func noEmpty[T any](l envconfig.Lookuper) error {
	t := reflect.TypeFor[T]()
	for i := range t.NumField() {
		name, opts, _ := strings.Cut(t.Field(i).Tag.Get("env"), ",")
		if name == "" || emptyMeans[name] || !strings.Contains(opts, "default=") && !strings.Contains(opts, "required") {
			continue
		}
		if v, ok := l.Lookup(name); ok && strings.TrimSpace(v) == "" {
			return badVar(name, "is set but empty: give a value, or unset it for the default")
		}
	}
	return nil
}

// envError rewrites go-envconfig's errors into one line that starts with the
// variable's name.
func envError[T any](err error) error {
	msg := err.Error()
	if errors.Is(err, envconfig.ErrMissingRequired) {
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			return badVar(msg[i+2:], "required but not set")
		}
	}
	// Parse errors start with the Go field's name: name the variable.
	msg = strings.ReplaceAll(msg, "\n", " ")
	if field, rest, ok := strings.Cut(msg, ": "); ok {
		if f, ok := reflect.TypeFor[T]().FieldByName(field); ok {
			name, _, _ := strings.Cut(f.Tag.Get("env"), ",")
			return badVar(name, "invalid value: %s", rest)
		}
	}
	return &configError{msg: msg}
}

func (c *config) validate() error {
	var err error
	if c.table, err = schema.ParseTable(c.OutboxTable); err != nil {
		return badVar("RELAY_OUTBOX_TABLE", "%q is not a valid table name: want name or schema.name, lower-case letters, digits and _", c.OutboxTable)
	}
	if c.targets, err = relay.ParseTargets(c.Targets); err != nil {
		return badVar("RELAY_TARGETS", "%v", err)
	}
	if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		// pgx's message may quote the URL; ours does not.
		return badVar("RELAY_DATABASE_URL", "cannot be parsed as a Postgres URL or key=value DSN")
	}
	if c.wants(relay.TargetNATS) {
		if err := checkNATSURL(c.NATSURL); err != nil {
			return badVar("RELAY_NATS_URL", "%v", err)
		}
		if c.NATSStream == "" || strings.ContainsAny(c.NATSStream, " \t.*>") {
			return badVar("RELAY_NATS_STREAM", "%q is not a valid stream name", c.NATSStream)
		}
		if p := c.NATSSubjectPrefix; p != "" && (strings.ContainsAny(p, " \t\r\n*>") || !strings.HasSuffix(p, ".") || strings.HasPrefix(p, ".") || strings.Contains(p, "..")) {
			return badVar("RELAY_NATS_SUBJECT_PREFIX", "%q must be subject tokens ending in '.', like \"events.\"", p)
		}
		if c.NATSDupWindow <= 0 {
			return badVar("RELAY_NATS_DUPLICATE_WINDOW", "must be positive")
		}
	}
	if c.wants(relay.TargetAMQP) {
		if err := checkAMQPURL(c.AMQPURL); err != nil {
			return badVar("RELAY_AMQP_URL", "%v", err)
		}
		if c.AMQPExchange == "" {
			return badVar("RELAY_AMQP_EXCHANGE", "must not be empty")
		}
	}
	for _, f := range []struct{ name, path string }{
		{"RELAY_NATS_CREDS", c.NATSCreds}, {"RELAY_NATS_NKEY", c.NATSNKey}, {"RELAY_NATS_CA", c.NATSCA},
		{"RELAY_NATS_CERT", c.NATSCert}, {"RELAY_NATS_KEY", c.NATSKey},
		{"RELAY_AMQP_CA", c.AMQPCA}, {"RELAY_AMQP_CERT", c.AMQPCert}, {"RELAY_AMQP_KEY", c.AMQPKey},
	} {
		if f.path == "" {
			continue
		}
		if _, err := os.ReadFile(f.path); err != nil {
			return badVar(f.name, "cannot read %s", f.path)
		}
	}
	if (c.NATSCert == "") != (c.NATSKey == "") {
		return badVar("RELAY_NATS_CERT", "RELAY_NATS_CERT and RELAY_NATS_KEY go together")
	}
	if (c.AMQPCert == "") != (c.AMQPKey == "") {
		return badVar("RELAY_AMQP_CERT", "RELAY_AMQP_CERT and RELAY_AMQP_KEY go together")
	}
	// What the clients will load, loaded now: a file without a
	// certificate, a key that is not the certificate's, a seed that is not
	// one are configuration errors, not a failure at the first connect.
	if err := checkTLSFiles("RELAY_NATS", c.NATSCA, c.NATSCert, c.NATSKey); err != nil {
		return err
	}
	if err := checkTLSFiles("RELAY_AMQP", c.AMQPCA, c.AMQPCert, c.AMQPKey); err != nil {
		return err
	}
	if c.NATSNKey != "" {
		if _, err := nats.NkeyOptionFromSeed(c.NATSNKey); err != nil {
			return badVar("RELAY_NATS_NKEY", "%s holds no nkey seed", c.NATSNKey)
		}
	}
	if c.NATSCreds != "" {
		// As nats.go reads it: a user JWT and its nkey seed, decorated or not.
		data, _ := os.ReadFile(c.NATSCreds)
		if _, err := nkeys.ParseDecoratedNKey(data); err != nil {
			return badVar("RELAY_NATS_CREDS", "%s is not a NATS credentials file (a user JWT and its nkey seed)", c.NATSCreds)
		}
	}
	if c.MetricsAddr != "" && !validListenAddr(c.MetricsAddr) {
		return badVar("RELAY_METRICS_ADDR", "%q is not host:port with a port of 0..65535", c.MetricsAddr)
	}
	for _, v := range []struct {
		name     string
		val, min int
		max      int
	}{
		{"RELAY_BATCH_SIZE", c.BatchSize, 2, 10000}, // see relay.Config.BatchSize
		{"RELAY_WORKERS", c.Workers, 1, 256},
		{"RELAY_MAX_ATTEMPTS", c.MaxAttempts, 0, 1000000},
	} {
		if v.val < v.min || v.val > v.max {
			return badVar(v.name, "%d is out of range %d..%d", v.val, v.min, v.max)
		}
	}
	for _, v := range []struct {
		name string
		d    time.Duration
	}{
		{"RELAY_PUBLISH_TIMEOUT", c.PublishTimeout},
		{"RELAY_POLL_INTERVAL", c.PollInterval},
		{"RELAY_RETENTION", c.Retention},
		{"RELAY_STATS_INTERVAL", c.StatsInterval},
		{"RELAY_RETRY_MIN", c.RetryMin},
		{"RELAY_RETRY_MAX", c.RetryMax},
		{"RELAY_STARTUP_TIMEOUT", c.StartupTimeout},
		{"RELAY_SHUTDOWN_TIMEOUT", c.ShutdownGrace},
	} {
		if v.d <= 0 {
			return badVar(v.name, "must be a positive duration, like 10s")
		}
	}
	if c.RetryMax < c.RetryMin {
		return badVar("RELAY_RETRY_MAX", "%s is below RELAY_RETRY_MIN %s", c.RetryMax, c.RetryMin)
	}
	if err := c.logLevel.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return badVar("RELAY_LOG_LEVEL", "%q: want debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return badVar("RELAY_LOG_FORMAT", "%q: want text or json", c.LogFormat)
	}
	return nil
}

// validateRun checks what only `relayd run` uses. A batch in flight at
// SIGTERM waits up to the publish timeout for its confirms, then records
// them: cut shorter, its confirmed rows are published again.
func (c *config) validateRun() error {
	if c.ShutdownGrace <= c.PublishTimeout {
		return badVar("RELAY_SHUTDOWN_TIMEOUT", "%s must exceed RELAY_PUBLISH_TIMEOUT %s: in-flight batches wait that long for their confirms", c.ShutdownGrace, c.PublishTimeout)
	}
	return nil
}

// validListenAddr says whether addr is host:port with a port of 0..65535.
func validListenAddr(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = strconv.ParseUint(port, 10, 16)
	}
	return err == nil
}

func (c *config) wants(t relay.Target) bool {
	for _, x := range c.targets {
		if x == t {
			return true
		}
	}
	return false
}

// checkTLSFiles loads a CA bundle and a client certificate and key as the
// TLS client will; prefix names the variables.
func checkTLSFiles(prefix, ca, cert, key string) error {
	if ca != "" {
		pem, _ := os.ReadFile(ca)
		if !x509.NewCertPool().AppendCertsFromPEM(pem) {
			return badVar(prefix+"_CA", "no PEM certificate in %s", ca)
		}
	}
	if cert != "" {
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return badVar(prefix+"_CERT", "%s and %s are not a certificate and its key: %v", cert, prefix+"_KEY", err)
		}
	}
	return nil
}

// checkNATSURL checks a NATS server list as nats.go reads it: URLs
// separated by commas, spaces around them allowed, nats:// taken for a
// server without a scheme.
func checkNATSURL(s string) error {
	if strings.TrimSpace(s) == "" {
		return errors.New("must not be empty")
	}
	servers := 0
	for p := range strings.SplitSeq(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue // nats.go skips an empty entry (a trailing comma)
		}
		servers++
		if !strings.Contains(p, "://") {
			p = "nats://" + p
		}
		if err := checkURL(p, "nats", "tls", "ws", "wss"); err != nil {
			return err
		}
	}
	if servers == 0 {
		return errors.New("names no server")
	}
	return nil
}

// checkURL checks that s parses as a URL with one of the schemes. The error
// never repeats the URL, which may hold a password.
func checkURL(s string, schemes ...string) error {
	if s == "" {
		return errors.New("must not be empty")
	}
	u, err := url.Parse(s)
	if err != nil {
		return errors.New("is not a valid URL")
	}
	for _, sc := range schemes {
		if u.Scheme == sc {
			if u.Host == "" {
				return errors.New("has no host")
			}
			return nil
		}
	}
	return fmt.Errorf("scheme %q: want %s://", u.Scheme, strings.Join(schemes, ":// or "))
}

// checkAMQPURL checks s as checkURL does, then as amqp091-go will parse it
// when it dials (a vhost or a query it refuses); its error, which quotes
// the URL, is not repeated.
func checkAMQPURL(s string) error {
	if err := checkURL(s, "amqp", "amqps"); err != nil {
		return err
	}
	if _, err := amqp.ParseURI(s); err != nil {
		return errors.New("is not a URI RabbitMQ's client accepts (amqp[s]://user:password@host:port/vhost)")
	}
	return nil
}

// amqpTLS builds the TLS configuration for amqps:// from RELAY_AMQP_CA,
// RELAY_AMQP_CERT and RELAY_AMQP_KEY; nil means the system defaults.
func (c *config) amqpTLS() (*tls.Config, error) {
	if c.AMQPCA == "" && c.AMQPCert == "" {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.AMQPCA != "" {
		pem, err := os.ReadFile(c.AMQPCA)
		if err != nil {
			return nil, fmt.Errorf("RELAY_AMQP_CA: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("RELAY_AMQP_CA: no PEM certificate in %s", c.AMQPCA)
		}
	}
	if c.AMQPCert != "" {
		cert, err := tls.LoadX509KeyPair(c.AMQPCert, c.AMQPKey)
		if err != nil {
			return nil, fmt.Errorf("RELAY_AMQP_CERT/KEY: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// amqpURLOK checks RELAY_AMQP_URL for a command that reads the legacy queue
// whatever the relay's targets (config.validate checks it only with the
// amqp target on); if it is bad, it says so on stderr without the URL —
// amqp091-go's own parse error quotes the whole URL, password and all.
func amqpURLOK(env envconfig.Lookuper, stderr io.Writer) bool {
	u, ok := env.Lookup("RELAY_AMQP_URL")
	if !ok {
		return true
	}
	if err := checkAMQPURL(u); err != nil {
		fmt.Fprintf(stderr, "relayd: config: RELAY_AMQP_URL: %v\n", err)
		return false
	}
	return true
}

// redact returns a NATS server list fit for logs: URLs separated by commas
// (nats.go splits the list there too), each as redactURL has it, nats://
// taken for a server without a scheme.
func redact(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		p = strings.TrimSpace(p)
		if !strings.Contains(p, "://") {
			p = "nats://" + p
		}
		parts[i] = redactURL(p)
	}
	return strings.Join(parts, ",")
}

// redactURL returns one URL fit for logs: its password replaced, and a NATS
// token (the user part of a nats:// URL without a password). The user part
// runs to the last '@', not to the first '/', '?' or '#' as url.Parse has
// it: a token or password with one of those left unescaped would otherwise
// be read as the path, and printed. A host whose port is not a number — a
// fragment of a password, say, the rest past a ',' — is not printed.
func redactURL(s string) string {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return "(unparseable URL)"
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		user, _, hasPassword := strings.Cut(rest[:at], ":")
		switch {
		case hasPassword:
			rest = user + ":xxxxx" + rest[at:]
		case slices.Contains([]string{"nats", "tls", "ws", "wss"}, scheme):
			rest = "xxxxx" + rest[at:]
		}
	}
	hostport := rest[strings.LastIndexByte(rest, '@')+1:]
	if i := strings.IndexAny(hostport, "/?#"); i >= 0 {
		hostport = hostport[:i]
	}
	if _, port, err := net.SplitHostPort(hostport); err == nil {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			return "(unparseable URL)"
		}
	}
	return scheme + "://" + rest
}
