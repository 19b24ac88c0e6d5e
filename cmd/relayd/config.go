package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// config is relayd's whole configuration, read from RELAY_* variables. Its
// defaults are the env tags; docs_test.go holds docs/configuration.md and
// defaults_test.go the relay's Default* constants to them. validate checks
// values only.
type config struct {
	DatabaseURL          string `env:"RELAY_DATABASE_URL, required"`
	DatabasePasswordFile string `env:"RELAY_DATABASE_PASSWORD_FILE"`
	NATSURL              string `env:"RELAY_NATS_URL, default=nats://127.0.0.1:4222"`
	NATSPasswordFile     string `env:"RELAY_NATS_PASSWORD_FILE"`
	NATSCreds            string `env:"RELAY_NATS_CREDS"`
	NATSNKey             string `env:"RELAY_NATS_NKEY"`
	NATSCA               string `env:"RELAY_NATS_CA"`
	NATSCert             string `env:"RELAY_NATS_CERT"`
	NATSKey              string `env:"RELAY_NATS_KEY"`
	AMQPURL              string `env:"RELAY_AMQP_URL, default=amqp://guest:guest@127.0.0.1:5672/"`
	AMQPPasswordFile     string `env:"RELAY_AMQP_PASSWORD_FILE"`
	AMQPCA               string `env:"RELAY_AMQP_CA"`
	AMQPCert             string `env:"RELAY_AMQP_CERT"`
	AMQPKey              string `env:"RELAY_AMQP_KEY"`

	Targets           string        `env:"RELAY_TARGETS"`
	NATSStream        string        `env:"RELAY_NATS_STREAM, default=OUTBOX"`
	NATSSubjectPrefix string        `env:"RELAY_NATS_SUBJECT_PREFIX, default=outbox."`
	NATSDupWindow     time.Duration `env:"RELAY_NATS_DUPLICATE_WINDOW, default=2m"`
	AMQPExchange      string        `env:"RELAY_AMQP_EXCHANGE, default=outbox"`
	RoutesFile        string        `env:"RELAY_ROUTES"`
	OutboxTable       string        `env:"RELAY_OUTBOX_TABLE, default=outbox"`
	MetricsAddr       string        `env:"RELAY_METRICS_ADDR, default=127.0.0.1:9090"`
	PProf             bool          `env:"RELAY_PPROF, default=false"`
	Console           bool          `env:"RELAY_CONSOLE, default=true"`
	ConsoleCutover    string        `env:"RELAY_CONSOLE_CUTOVER"`
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
	targets  []relay.Target // RELAY_TARGETS, or every target when it is unset
	pinned   bool           // RELAY_TARGETS is set: the relay does not follow the table's phase
	logLevel slog.Level
	routes   *route.Table // RELAY_ROUTES' routes, then the default route
	// RELAY_DATABASE_PASSWORD_FILE's password, for connectPostgres (those of
	// the brokers are set into their URLs).
	databasePassword string
	// RELAY_CONSOLE_CUTOVER's groups, their streams resolved (validateRun).
	consoleGroups []cutover.Group
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
		return nil, envError[config](err, l)
	}
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// emptyMeans are the variables with a default whose empty value is a
// setting of its own: no metrics listener; subjects without a prefix; any
// stream that captures a subject.
var emptyMeans = map[string]bool{"RELAY_METRICS_ADDR": true, "RELAY_NATS_SUBJECT_PREFIX": true, "RELAY_NATS_STREAM": true}

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
// variable's name: for a value it cannot parse, the value and what the
// variable accepts (RELAY_PPROF="yes": want true or false), whatever the
// variable, by its field's type.
func envError[T any](err error, l envconfig.Lookuper) error {
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
			v, _ := l.Lookup(name)
			if want := accepts(f.Type); want != "" {
				return &configError{msg: fmt.Sprintf("%s=%q: want %s", name, v, want)}
			}
			return badVar(name, "invalid value %q: %s", v, rest)
		}
	}
	return &configError{msg: msg}
}

// accepts says what a variable of type t accepts, for envError; "" for a
// type whose parse error says it better.
func accepts(t reflect.Type) string {
	if t == reflect.TypeFor[time.Duration]() {
		return "a duration such as 500ms, 5s, 2m or 1h30m"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return "a whole number"
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number, 0 or more"
	case reflect.Float32, reflect.Float64:
		return "a number, like 2.5"
	}
	return ""
}

// validateRun checks what only `relayd run` uses: the console's settings,
// and the shutdown timeout. A batch in flight at SIGTERM waits up to the
// publish timeout for its confirms, then records them: cut shorter, its
// confirmed rows are published again.
func (c *config) validateRun() error {
	if c.ShutdownGrace <= c.PublishTimeout {
		return badVar("RELAY_SHUTDOWN_TIMEOUT", "%s must exceed RELAY_PUBLISH_TIMEOUT %s: in-flight batches wait that long for their confirms", c.ShutdownGrace, c.PublishTimeout)
	}
	return c.validateConsole()
}

func (c *config) wants(t relay.Target) bool {
	for _, x := range c.targets {
		if x == t {
			return true
		}
	}
	return false
}
