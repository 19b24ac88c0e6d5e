package amqpsink

import (
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// unroutableEvery is the most often one topic's unroutable warning repeats.
const unroutableEvery = 30 * time.Second

// unroutableTopics bounds the topics remembered between warnings.
const unroutableTopics = 1024

// unroutableWarner says at once that RabbitMQ returned a message as
// unroutable: the relay only retries the row, silently, until its attempts
// run out and it is parked (an hour with the defaults). At most one line
// per topic every unroutableEvery, with the count of returns it left out.
type unroutableWarner struct {
	log *slog.Logger
	now func() time.Time

	mu         sync.Mutex
	last       map[string]time.Time // topic -> when it was last warned of
	suppressed map[string]int
}

func newUnroutableWarner(log *slog.Logger) *unroutableWarner {
	return &unroutableWarner{log: log, now: time.Now, last: map[string]time.Time{}, suppressed: map[string]int{}}
}

// returned notes one basic.return. Safe for concurrent use.
func (w *unroutableWarner) returned(r amqp.Return) {
	w.mu.Lock()
	defer w.mu.Unlock()
	now, topic := w.now(), r.RoutingKey
	if at, ok := w.last[topic]; ok && now.Sub(at) < unroutableEvery {
		w.suppressed[topic]++
		return
	}
	if len(w.last) >= unroutableTopics {
		w.forget(now)
	}
	w.log.Warn("RabbitMQ returned a message as unroutable: no queue bound to the exchange matches its topic. "+
		"Bind a queue to the exchange with a routing key that matches the topic, or check the row's topic; "+
		"until then the row is retried, and parked when its attempts run out",
		"topic", topic, "exchange", r.Exchange, "reply", r.ReplyText, "reply_code", r.ReplyCode,
		"message_id", r.MessageId, "suppressed", w.suppressed[topic])
	w.last[topic] = now
	delete(w.suppressed, topic)
}

// forget drops the topics not warned of within unroutableEvery, and all of
// them if that leaves the map full: a flood of distinct topics costs at
// most one line each per reset, never unbounded memory.
func (w *unroutableWarner) forget(now time.Time) {
	for topic, at := range w.last {
		if now.Sub(at) >= unroutableEvery {
			delete(w.last, topic)
			delete(w.suppressed, topic)
		}
	}
	if len(w.last) >= unroutableTopics {
		clear(w.last)
		clear(w.suppressed)
	}
}
