package main

import (
	"net"
	"slices"
	"strconv"
	"strings"

	"github.com/relayd/relayd/internal/amqpio"
)

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

// redactAMQP returns a RabbitMQ node list fit for logs: split where
// amqpio.SplitURLs splits it (so a ',' in a password stays in the password),
// each URL as redactURL has it, joined by commas.
func redactAMQP(s string) string {
	urls := amqpio.SplitURLs(s)
	if len(urls) == 0 {
		return redactURL(s)
	}
	for i, u := range urls {
		urls[i] = redactURL(u)
	}
	return strings.Join(urls, ",")
}

// redactURL returns one URL fit for logs: its password replaced, and a NATS
// token (the user part of a nats:// URL without a password). The user part
// runs to the last '@', not to the first '/', '?' or '#' as url.Parse has
// it: a token or password with one of those left unescaped would otherwise
// be read as the path, and printed. A host whose port is not a number — a
// fragment of a password, say, the rest past a ',' — is not printed; each
// host of a multi-host (Postgres) URL is checked so.
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
	if _, ok := hostsOf(rest); !ok {
		return "(unparseable URL)"
	}
	return scheme + "://" + rest
}

// hostsOf returns the host:port part of a URL's rest past "://": what
// follows the user part, up to the path. ok is false when a port is not a
// number. A Postgres URL may name several hosts: h1:5432,h2:5432.
func hostsOf(rest string) (hostport string, ok bool) {
	hostport = rest[strings.LastIndexByte(rest, '@')+1:]
	if i := strings.IndexAny(hostport, "/?#"); i >= 0 {
		hostport = hostport[:i]
	}
	for hp := range strings.SplitSeq(hostport, ",") {
		if _, port, err := net.SplitHostPort(hp); err == nil {
			if _, err := strconv.ParseUint(port, 10, 16); err != nil {
				return "", false
			}
		}
	}
	return hostport, true
}

// urlHosts returns the servers of a list of URLs as host:port, joined by
// commas, for a one-line message: no scheme, no user part, so no password.
func urlHosts(urls []string) string {
	out := make([]string, 0, len(urls))
	for _, u := range urls {
		_, rest, _ := strings.Cut(u, "://")
		if h, ok := hostsOf(rest); ok && h != "" {
			out = append(out, h)
		} else {
			out = append(out, "(unparseable URL)")
		}
	}
	return strings.Join(out, ",")
}

// natsURLs splits a NATS server list as redact does, nats:// taken for a
// server without a scheme.
func natsURLs(s string) []string {
	var out []string
	for p := range strings.SplitSeq(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !strings.Contains(p, "://") {
			p = "nats://" + p
		}
		out = append(out, p)
	}
	return out
}
