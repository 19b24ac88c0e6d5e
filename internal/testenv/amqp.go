package testenv

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ConfirmChannel is a channel in confirm mode on a RabbitMQ connection of
// its own, closed when the test ends.
func ConfirmChannel(t testing.TB) *amqp.Channel {
	t.Helper()
	conn, err := amqp.Dial(AMQPURL(t))
	if err != nil {
		t.Fatalf("amqp dial: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return ch
}

// Queue declares a durable queue on the shared RabbitMQ, deleted when the
// test ends (over a connection of its own: the test's may be closed by then).
func Queue(t testing.TB, name string) string {
	t.Helper()
	url := AMQPURL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		t.Fatalf("amqp dial: %v", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if c, err := amqp.Dial(url); err == nil {
			if ch, err := c.Channel(); err == nil {
				ch.QueueDelete(name, false, false, false) //nolint:errcheck // cleanup
			}
			c.Close()
		}
	})
	return name
}
