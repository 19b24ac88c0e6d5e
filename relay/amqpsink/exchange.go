package amqpsink

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
)

// EnsureExchange checks that the exchange exists, or with create declares
// it as a durable topic exchange. A missing exchange is reported by name.
// It never declares a queue: a durable catch-all that nobody reads would
// keep every message and fill RabbitMQ (relayd tail binds a temporary one).
func EnsureExchange(ctx context.Context, url string, tlsCfg *tls.Config, name string, create bool) error {
	conn, err := amqpio.DialURL(url, amqpio.DialOptions{TLS: tlsCfg, Timeout: 10 * time.Second})
	if err != nil {
		return fmt.Errorf("amqp: connect: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("amqp: channel: %w", err)
	}
	if create {
		if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return fmt.Errorf("amqp: declare exchange %q: %w", name, err)
		}
		return nil
	}
	if err := ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		var ae *amqp.Error
		if errors.As(err, &ae) && ae.Code == amqp.NotFound {
			return fmt.Errorf("amqp: exchange %q does not exist (create it, or set RELAY_PROVISION=true)", name)
		}
		return fmt.Errorf("amqp: check exchange %q: %w", name, err)
	}
	return nil
}

// MissingExchanges returns those of names RabbitMQ has no exchange of, on
// one connection (a missing one closes its channel: a channel each).
func MissingExchanges(ctx context.Context, url string, tlsCfg *tls.Config, names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, nil
	}
	conn, err := amqpio.DialURL(url, amqpio.DialOptions{TLS: tlsCfg, Timeout: 10 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("amqp: connect: %w", err)
	}
	defer conn.Close()
	var missing []string
	for _, name := range names {
		if err := ctx.Err(); err != nil {
			return missing, err
		}
		exists, err := exchangeExists(conn, name)
		if err != nil {
			return missing, fmt.Errorf("amqp: check exchange %q: %w", name, err)
		}
		if !exists {
			missing = append(missing, name)
		}
	}
	return missing, nil
}

// exchangeExists declares name passively on a channel of its own, which a
// missing exchange closes.
func exchangeExists(conn *amqp.Connection, name string) (bool, error) {
	ch, err := conn.Channel()
	if err != nil {
		return false, err
	}
	err = ch.ExchangeDeclarePassive(name, amqp.ExchangeDirect, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return false, nil
	}
	ch.Close() //nolint:errcheck // the check is answered
	return err == nil, err
}
