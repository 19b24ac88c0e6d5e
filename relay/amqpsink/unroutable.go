package amqpsink

import (
	"log/slog"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/errlog"
)

// unroutableTopics bounds the topics remembered between warnings.
const unroutableTopics = 1024

// unroutableWarner says at once that RabbitMQ returned a message as
// unroutable: the relay only retries the row, silently, until its attempts
// run out and it is parked (an hour with the defaults). At most one line
// per topic every errlog.Every, with the count of returns it left out.
type unroutableWarner struct{ limit *errlog.PerKey }

func newUnroutableWarner(log *slog.Logger) *unroutableWarner {
	return &unroutableWarner{limit: errlog.NewPerKey(log, unroutableTopics)}
}

// returned notes one basic.return. Safe for concurrent use.
func (w *unroutableWarner) returned(r amqp.Return) {
	w.limit.Warn(r.RoutingKey, "RabbitMQ returned a message as unroutable: no queue bound to the exchange matches its topic. "+
		"Bind a queue to the exchange with a routing key that matches the topic, or check the row's topic; "+
		"until then the row is retried, and parked when its attempts run out",
		"topic", r.RoutingKey, "exchange", r.Exchange, "reply", r.ReplyText, "reply_code", r.ReplyCode, "message_id", r.MessageId)
}
