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
