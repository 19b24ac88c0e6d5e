package main

import (
	"errors"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/relayd/relayd/internal/amqpio"
)

// The RELAY_*_PASSWORD_FILE settings keep passwords out of the URLs: the
// URLs can sit in a Kubernetes ConfigMap, the passwords in a Secret mounted
// as files, read raw (no URL escaping) and never in the environment.

// readPasswords reads the password files set and puts each password where
// its client finds it: into every URL of RELAY_AMQP_URL and RELAY_NATS_URL,
// and into databasePassword, which connectPostgres sets on pgx's config.
// Each URL must name the user and hold no password of its own.
// defaultAMQPURL is RELAY_AMQP_URL's default, guest's on a local RabbitMQ.
const defaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

func (c *config) readPasswords() error {
	if c.DatabasePasswordFile != "" {
		pw, err := readPassword("RELAY_DATABASE_PASSWORD_FILE", c.DatabasePasswordFile)
		if err != nil {
			return err
		}
		switch user, password := pgCredentials(c.DatabaseURL); {
		case password:
			return badVar("RELAY_DATABASE_PASSWORD_FILE", "RELAY_DATABASE_URL holds a password already: remove it from the URL, or unset RELAY_DATABASE_PASSWORD_FILE")
		case !user:
			return badVar("RELAY_DATABASE_PASSWORD_FILE", "RELAY_DATABASE_URL names no user for the password: write one, as postgres://USER@host/db or user=USER")
		}
		c.databasePassword = pw
	}
	if c.AMQPPasswordFile != "" {
		if c.AMQPURL == defaultAMQPURL {
			return badVar("RELAY_AMQP_PASSWORD_FILE", "RELAY_AMQP_URL is unset, and its default (%s) holds guest's password: set it, naming the user", redactURL(defaultAMQPURL))
		}
		// Checked here whatever the targets: backfill, replay and cutover
		// read the legacy queue with the amqp target off.
		if err := checkAMQPURL(c.AMQPURL); err != nil {
			return badVar("RELAY_AMQP_URL", "%v", err)
		}
		pw, err := readPassword("RELAY_AMQP_PASSWORD_FILE", c.AMQPPasswordFile)
		if err != nil {
			return err
		}
		urls, err := setPassword("RELAY_AMQP", "node", amqpio.SplitURLs(c.AMQPURL), pw, "as amqp://USER@host:5672/")
		if err != nil {
			return err
		}
		c.AMQPURL = strings.Join(urls, ",")
	}
	if c.NATSPasswordFile != "" {
		if c.NATSCreds != "" || c.NATSNKey != "" {
			return badVar("RELAY_NATS_PASSWORD_FILE", "set beside RELAY_NATS_CREDS or RELAY_NATS_NKEY: authenticate one way, and empty the other")
		}
		if err := checkNATSURL(c.NATSURL); err != nil {
			return badVar("RELAY_NATS_URL", "%v", err)
		}
		pw, err := readPassword("RELAY_NATS_PASSWORD_FILE", c.NATSPasswordFile)
		if err != nil {
			return err
		}
		urls, err := setPassword("RELAY_NATS", "server", natsURLs(c.NATSURL), pw,
			"as nats://USER@host:4222, or authenticate with RELAY_NATS_CREDS or RELAY_NATS_NKEY instead")
		if err != nil {
			return err
		}
		c.NATSURL = strings.Join(urls, ",")
	}
	return nil
}

// readPassword reads the password file name sets: its content, less one
// trailing newline ("\n" or "\r\n", as kubectl create secret --from-file
// and editors leave). Errors name the path, never the content.
func readPassword(name, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is said once
		}
		return "", badVar(name, "cannot read %s: %v", path, err)
	}
	pw := string(b)
	if s, ok := strings.CutSuffix(pw, "\r\n"); ok {
		pw = s
	} else {
		pw = strings.TrimSuffix(pw, "\n")
	}
	if pw == "" {
		return "", badVar(name, "%s is empty", path)
	}
	return pw, nil
}

// setPassword returns urls, each with password in its user part,
// percent-escaped. prefix names the settings (RELAY_AMQP), entry a URL of
// a list; fix says how to name a user.
func setPassword(prefix, entry string, urls []string, password, fix string) ([]string, error) {
	out := make([]string, len(urls))
	for i, s := range urls {
		which := fmt.Sprintf("%s_URL (%s)", prefix, redactURL(s))
		if len(urls) > 1 {
			which = fmt.Sprintf("%s_URL %s %d of %d (%s)", prefix, entry, i+1, len(urls), redactURL(s))
		}
		u, err := url.Parse(s)
		if err != nil {
			return nil, &configError{msg: which + " is not a valid URL"} // checked before: not reached
		}
		if _, ok := u.User.Password(); ok {
			return nil, badVar(prefix+"_PASSWORD_FILE", "%s holds a password already: remove it from the URL, or unset %s_PASSWORD_FILE", which, prefix)
		}
		if u.User.Username() == "" {
			return nil, badVar(prefix+"_PASSWORD_FILE", "%s names no user for the password: write one, %s", which, fix)
		}
		// The user part ends at the last '@' before the path, query or
		// fragment, as url.Parse reads it.
		scheme, rest, _ := strings.Cut(s, "://")
		authority := rest
		if j := strings.IndexAny(rest, "/?#"); j >= 0 {
			authority = rest[:j]
		}
		at := strings.LastIndexByte(authority, '@')
		out[i] = scheme + "://" + rest[:at] + ":" + escapeUserinfo(password) + rest[at:]
	}
	return out, nil
}

// escapeUserinfo percent-escapes every byte of s but RFC 3986's unreserved
// ones: url.UserPassword leaves ',' as it is, where nats.go and
// amqpio.SplitURLs split a list.
func escapeUserinfo(s string) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// pgCredentials says whether a Postgres URL or key=value DSN names a user
// and holds a password itself — not through PGUSER, PGPASSWORD or a
// passfile, which pgx falls back on. pgx parses a probe that sets both to a
// mark before the string's own settings, which win.
func pgCredentials(s string) (user, password bool) {
	const mark = "relayd-unset"
	probe := "user=" + mark + " password=" + mark + " " + s
	if rest, ok := cutPostgresScheme(s); ok {
		// As pgx reads a URL: a user part up to the last '@' before the
		// path, query or fragment, then the query, whose user and password
		// win over it.
		authority := rest
		if j := strings.IndexAny(rest, "/?#"); j >= 0 {
			authority = rest[:j]
		}
		if i := strings.LastIndexByte(authority, '@'); i >= 0 {
			u, p, _ := strings.Cut(rest[:i], ":")
			user, password = u != "", p != ""
			rest = rest[i+1:]
		}
		hosts, query, _ := strings.Cut(rest, "?")
		hosts, _, _ = strings.Cut(hosts, "/")
		// The '/' ends the authority for pgx, whatever the query holds.
		probe = "postgres://" + hosts + "/?user=" + mark + "&password=" + mark
		if query != "" {
			probe += "&" + query
		}
	}
	c, err := pgconn.ParseConfig(probe)
	if err != nil {
		return user, password // validateWhere has said what is wrong
	}
	return user || c.User != mark && c.User != "", password || c.Password != mark && c.Password != ""
}

// cutPostgresScheme returns a Postgres URL past its scheme; ok is false for
// a key=value DSN.
func cutPostgresScheme(s string) (rest string, ok bool) {
	if rest, ok = strings.CutPrefix(s, "postgresql://"); ok {
		return rest, true
	}
	return strings.CutPrefix(s, "postgres://")
}
