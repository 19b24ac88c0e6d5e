package amqpsink

import (
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"
)

func amqpErr(what string, e *amqp.Error) error {
	if e == nil {
		return errors.New("amqp " + what)
	}
	return fmt.Errorf("amqp %s: %w", what, e)
}
