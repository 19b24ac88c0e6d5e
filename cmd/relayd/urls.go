package main

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/internal/amqpio"
)

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

// checkAMQPURL checks a RabbitMQ node list (RELAY_AMQP_URL), split as
// amqpio.SplitURLs splits it: each URL as checkAMQPNode does. A list's
// error names the node by its place and redacted URL.
func checkAMQPURL(s string) error {
	urls := amqpio.SplitURLs(s)
	switch len(urls) {
	case 0:
		if strings.TrimSpace(s) == "" {
			return errors.New("must not be empty")
		}
		return errors.New("names no node")
	case 1:
		return checkAMQPNode(urls[0])
	}
	for i, u := range urls {
		if err := checkAMQPNode(u); err != nil {
			return fmt.Errorf("node %d of %d (%s): %v", i+1, len(urls), redactURL(u), err)
		}
	}
	return nil
}

// checkAMQPNode checks one URL as checkURL does, then as amqp091-go will
// parse it when it dials (a vhost or a query it refuses); its error, which
// quotes the URL, is not repeated.
func checkAMQPNode(s string) error {
	if err := checkURL(s, "amqp", "amqps"); err != nil {
		return err
	}
	if _, err := amqp.ParseURI(s); err != nil {
		return errors.New("is not a URI RabbitMQ's client accepts (amqp[s]://user:password@host:port/vhost)")
	}
	return nil
}

// amqpURLVar checks RELAY_AMQP_URL for a command that reads the legacy
// queue whatever the relay's targets (config.validate checks it only with
// the amqp target on); a bad one is a configuration error that does not
// quote the URL — amqp091-go's own parse error quotes the whole URL,
// password and all.
func amqpURLVar(env envconfig.Lookuper) error {
	u, ok := env.Lookup("RELAY_AMQP_URL")
	if !ok {
		return nil
	}
	if err := checkAMQPURL(u); err != nil {
		return badVar("RELAY_AMQP_URL", "%v", err)
	}
	return nil
}
