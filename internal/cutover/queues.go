package cutover

import (
	"context"
	"crypto/tls"
	"errors"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
)

// queues reads legacy queues over one connection, dialled on first use and
// again after it fails.
type queues struct {
	url  string
	tls  *tls.Config
	conn *amqp.Connection
}

type queueState struct {
	exists              bool
	messages, consumers int
}

// state reads a queue with a passive declare, on a channel of its own: a
// queue that does not exist closes the channel (404).
func (q *queues) state(ctx context.Context, name string) (queueState, error) {
	if err := ctx.Err(); err != nil {
		return queueState{}, err
	}
	if q.conn == nil || q.conn.IsClosed() {
		c, err := amqpio.DialURL(q.url, amqpio.DialOptions{TLS: q.tls, Timeout: 10 * time.Second})
		if err != nil {
			return queueState{}, err
		}
		q.conn = c
	}
	ch, err := q.conn.Channel()
	if err != nil {
		q.close()
		return queueState{}, err
	}
	defer ch.Close()
	st, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Code == amqp.NotFound {
		return queueState{}, nil
	}
	if err != nil {
		return queueState{}, err
	}
	return queueState{exists: true, messages: st.Messages, consumers: st.Consumers}, nil
}

func (q *queues) close() {
	if q.conn != nil {
		q.conn.Close()
		q.conn = nil
	}
}
