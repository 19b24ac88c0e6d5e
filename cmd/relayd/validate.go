package main

import (
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// validate checks the values the tags gave (ranges, formats, files) and
// derives table, targets and logLevel, and reads the password files. The
// first problem found is returned.
func (c *config) validate() error {
	for _, check := range []func() error{
		c.validateWhere, c.validateNATS, c.validateAMQP, c.validateRoutes, c.validateFiles,
		c.readPasswords, c.validateCredentials, c.validateTunables, c.validateLogging,
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// validateWhere checks the table, the targets and the database URL.
func (c *config) validateWhere() error {
	var err error
	if c.table, err = schema.ParseTable(c.OutboxTable); err != nil {
		return badVar("RELAY_OUTBOX_TABLE", "%q is not a valid table name: want name or schema.name, lower-case letters, digits and _", c.OutboxTable)
	}
	// Unset, the relay follows the table's phase, and may need either broker.
	c.pinned, c.targets = c.Targets != "", slices.Clone(relay.Targets)
	if c.pinned {
		if c.targets, err = relay.ParseTargets(c.Targets); err != nil {
			return badVar("RELAY_TARGETS", "%v", err)
		}
	}
	if _, err := pgxpool.ParseConfig(c.DatabaseURL); err != nil {
		// pgx's message may quote the URL; ours does not.
		return badVar("RELAY_DATABASE_URL", "cannot be parsed as a Postgres URL or key=value DSN")
	}
	return nil
}

// validateNATS checks the JetStream target's settings, when it is on.
func (c *config) validateNATS() error {
	if !c.wants(relay.TargetNATS) {
		return nil
	}
	if err := checkNATSURL(c.NATSURL); err != nil {
		return badVar("RELAY_NATS_URL", "%v", err)
	}
	if strings.ContainsAny(c.NATSStream, " \t.*>") {
		return badVar("RELAY_NATS_STREAM", "%q is not a valid stream name", c.NATSStream)
	}
	if c.NATSStream == "" && c.Provision {
		return badVar("RELAY_NATS_STREAM", "is empty (any stream that captures a subject), so RELAY_PROVISION has no stream to create: name one, or create your streams")
	}
	if p := c.NATSSubjectPrefix; p != "" && (strings.ContainsAny(p, " \t\r\n*>") || !strings.HasSuffix(p, ".") || strings.HasPrefix(p, ".") || strings.Contains(p, "..")) {
		return badVar("RELAY_NATS_SUBJECT_PREFIX", "%q must be subject tokens ending in '.', like \"events.\"", p)
	}
	if c.NATSDupWindow <= 0 {
		return badVar("RELAY_NATS_DUPLICATE_WINDOW", "must be positive")
	}
	return nil
}

// validateAMQP checks the RabbitMQ target's settings, when it is on.
func (c *config) validateAMQP() error {
	if !c.wants(relay.TargetAMQP) {
		return nil
	}
	if err := checkAMQPURL(c.AMQPURL); err != nil {
		return badVar("RELAY_AMQP_URL", "%v", err)
	}
	if c.AMQPExchange == "" {
		return badVar("RELAY_AMQP_EXCHANGE", "must not be empty")
	}
	return nil
}

// validateRoutes reads RELAY_ROUTES: a route the file gets wrong would send
// rows where nobody reads them.
func (c *config) validateRoutes() error {
	d := route.Defaults{Exchange: c.AMQPExchange, SubjectPrefix: c.NATSSubjectPrefix, Stream: c.NATSStream}
	if c.RoutesFile == "" {
		c.routes = route.Default(d)
		return nil
	}
	var err error
	if c.routes, err = route.Load(c.RoutesFile, d); err != nil {
		return badVar("RELAY_ROUTES", "%v", err)
	}
	return nil
}

// needStream refuses an empty RELAY_NATS_STREAM to the commands that read
// one stream (backfill, replay, cutover, verify, tail).
func (c *config) needStream() error {
	if c.NATSStream == "" {
		return badVar("RELAY_NATS_STREAM", "is empty (any stream, for relayd run): this command reads one stream; name it")
	}
	return nil
}

// validateFiles checks that every file named can be read, and that
// certificates and keys come in pairs.
func (c *config) validateFiles() error {
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
	return nil
}

// validateCredentials loads what the clients will load, now: a file without
// a certificate, a key that is not the certificate's, a seed that is not
// one are configuration errors, not a failure at the first connect.
func (c *config) validateCredentials() error {
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
	return nil
}

// validateTunables checks the listener address and the ranges of the
// numbers and durations.
func (c *config) validateTunables() error {
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
	return nil
}

// validateLogging checks the log level and format.
func (c *config) validateLogging() error {
	if err := c.logLevel.UnmarshalText([]byte(c.LogLevel)); err != nil {
		return badVar("RELAY_LOG_LEVEL", "%q: want debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		return badVar("RELAY_LOG_FORMAT", "%q: want text or json", c.LogFormat)
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
