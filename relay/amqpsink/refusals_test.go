package amqpsink

import (
	"errors"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/route"
	"github.com/relayd/relayd/relay"
)

// Every answer RabbitMQ gives a publish, as the sink turns it into a
// result, and what the relay makes of it. A new refusal needs a row here:
// what an operator can fix on the broker pauses, never parks.
func TestRefusals(t *testing.T) {
	const (
		park    = "park"              // the row, wrong in itself
		attempt = "retry, an attempt" // parked when its attempts run out
		pause   = "pause the target"  // the broker's state, for every row
		wait    = "wait, no attempt"  // the broker's state, for one route's rows
	)
	verdict := func(err error) string {
		switch {
		case relay.IsPermanent(err):
			return park
		case errors.Is(err, relay.ErrNoDestination):
			return wait
		case errors.Is(err, relay.ErrUnavailable):
			return pause
		}
		return attempt
	}
	confirmed := func(returned string, ack bool) error {
		p := &pending{done: make(chan struct{}), returned: returned}
		p.confirm(ack)
		return p.err
	}
	closed := func(blocked string, e *amqp.Error) error {
		p := &pending{done: make(chan struct{})}
		l := &link{byTag: map[uint64]*pending{1: p}, byMsgID: map[string]*pending{}, blocked: blocked}
		l.failAll(e)
		return p.err
	}
	missing := func(exchange string) error {
		l := &link{exchanges: exchangeSet{missing: map[string]time.Time{exchange: time.Now()}}}
		return l.exchangeMissing(exchange)
	}
	checked := func(m relay.Message) error {
		_, err := checkedPublishing(&m, 131072, "relayd")
		return err
	}
	withHeader := func(k, v string) error {
		return checked(relay.Message{Topic: "t", MessageID: "m", Headers: map[string]string{k: v}})
	}
	for _, tc := range []struct {
		name string
		err  error
		want string
	}{
		{"returned unroutable: no queue bound for the topic", confirmed("NO_ROUTE", true), attempt},
		{"nacked: a queue full with reject-publish, or failing", confirmed("", false), attempt},
		{"a route's exchange missing (checked before the publish)", missing("x"), wait},
		{"the exchange missing (404 closes the channel)", closed("", &amqp.Error{Code: amqp.NotFound, Reason: "NOT_FOUND - no exchange 'x'"}), pause},
		{"write access refused (403 closes the channel)", closed("", &amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"}), pause},
		{"a node shutting down or in maintenance (320)", closed("", &amqp.Error{Code: amqp.ConnectionForced, Reason: "CONNECTION_FORCED"}), pause},
		{"the connection lost", closed("", nil), pause},
		{"the connection lost while blocked by an alarm", closed("memory", nil), pause},
		{"a routing key over 255 bytes", checked(relay.Message{Topic: strings.Repeat("k", 256), MessageID: "m"}), park},
		{"a route's routing key over 255 bytes", checked(relay.Message{Topic: "t", MessageID: "m", Route: &route.Dest{RoutingKey: strings.Repeat("k", 256)}}), park},
		{"a route's exchange over 255 bytes", checked(relay.Message{Topic: "t", MessageID: "m", Route: &route.Dest{Exchange: strings.Repeat("x", 256)}}), park},
		{"a header over 255 bytes", checked(relay.Message{Topic: "t", MessageID: "m", Headers: map[string]string{strings.Repeat("h", 256): "v"}}), park},
		{"a user-id not the connection's user (406 would close the channel)", withHeader("user-id", "billing"), park},
		{"a user-id differing from the connection's user in case alone", withHeader("User-Id", "Relayd"), park},
		{"a priority that is not a decimal 0-255", withHeader("priority", "256"), park},
		{"an expiration that is not milliseconds (406 would close the channel)", withHeader("expiration", "1.5"), park},
		{"a negative expiration", withHeader("Expiration", "-1"), park},
		{"a property value over 255 bytes", withHeader("reply-to", strings.Repeat("r", 256)), park},
		{"one property twice with different values", checked(relay.Message{Topic: "t", MessageID: "m", Headers: map[string]string{"type": "a", "Type": "b"}}), park},
	} {
		if got := verdict(tc.err); got != tc.want {
			t.Errorf("%s: %s (%v), want %s", tc.name, got, tc.err, tc.want)
		}
	}
}
