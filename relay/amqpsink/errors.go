package amqpsink

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

// ErrReturned is a message RabbitMQ could not route to any queue.
var ErrReturned = errors.New("amqp: returned unroutable")

// ErrNacked is a message RabbitMQ refused to take responsibility for: a
// queue it was routed to is full and set to refuse (x-overflow
// reject-publish), or a queue's process failed. Unlike relay.ErrOutOfRoom it
// counts as one of the row's attempts: a nack names no queue, and a message
// routed to several is in the others already, so retries back off and end,
// parked, after MaxAttempts (RELAY_MAX_ATTEMPTS=0: never).
var ErrNacked = errors.New("amqp: nacked by broker")

func amqpErr(what string, e *amqp.Error) error {
	if e == nil {
		return errors.New("amqp " + what)
	}
	return fmt.Errorf("amqp %s: %w", what, e)
}
