package amqpprop

import (
	"maps"
	"reflect"
	"strings"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/headers"
)

func TestFill(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    amqp.Publishing // Headers nil when none are left
		err     string          // a part of the error; "" for none
	}{
		{name: "no headers", headers: nil, want: amqp.Publishing{}},
		{name: "plain headers stay headers", headers: map[string]string{"tenant": "acme", "traceparent": "00-x"},
			want: amqp.Publishing{Headers: amqp.Table{"tenant": "acme", "traceparent": "00-x"}}},
		{name: "every property, moved not copied",
			headers: map[string]string{
				"content-type": "application/json", "content-encoding": "gzip", "correlation-id": "c-1",
				"reply-to": "replies", "expiration": "60000", "priority": "7", "type": "order.placed",
				"user-id": "billing", "app-id": "shop", "tenant": "acme",
			},
			want: amqp.Publishing{ContentType: "application/json", ContentEncoding: "gzip", CorrelationId: "c-1",
				ReplyTo: "replies", Expiration: "60000", Priority: 7, Type: "order.placed", UserId: "billing", AppId: "shop",
				Headers: amqp.Table{"tenant": "acme"}}},
		{name: "names in any case", headers: map[string]string{"Content-Type": "text/plain", "CORRELATION-ID": "c-2", "Reply-To": "r"},
			want: amqp.Publishing{ContentType: "text/plain", CorrelationId: "c-2", ReplyTo: "r"}},
		{name: "the relay's own and delivery-mode stay headers",
			headers: map[string]string{"message-id": "m", "timestamp": "t", "delivery-mode": "1", "Message-Id": "m2"},
			want:    amqp.Publishing{Headers: amqp.Table{"message-id": "m", "timestamp": "t", "delivery-mode": "1", "Message-Id": "m2"}}},
		{name: "an empty value sets nothing, and is moved", headers: map[string]string{"type": "", "priority": "", "x": "y"},
			want: amqp.Publishing{Headers: amqp.Table{"x": "y"}}},
		{name: "priority 0 is none", headers: map[string]string{"priority": "0"}, want: amqp.Publishing{}},
		{name: "two spellings, one value", headers: map[string]string{"content-type": "a/b", "Content-Type": "a/b"},
			want: amqp.Publishing{ContentType: "a/b"}},
		{name: "two spellings, one priority", headers: map[string]string{"priority": "7", "Priority": "07"},
			want: amqp.Publishing{Priority: 7}},
		{name: "two spellings, two values", headers: map[string]string{"content-type": "a/b", "Content-Type": "c/d"},
			err: `headers ["Content-Type" "content-type"] all set the AMQP content-type, with values ["c/d" "a/b"]`},
		{name: "two spellings, two priorities", headers: map[string]string{"priority": "1", "PRIORITY": "2"}, err: "AMQP priority"},
		{name: "a bad priority", headers: map[string]string{"priority": "300"}, err: `value of "priority" is "300"`},
		{name: "a bad expiration", headers: map[string]string{"Expiration": "1m"}, err: `value of "Expiration" is "1m"`},
		{name: "a long property", headers: map[string]string{"app-id": strings.Repeat("a", 256)}, err: "256 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var p amqp.Publishing
			err := Fill(&p, tc.headers)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(p, tc.want) {
				t.Errorf("Fill:\n got %+v\nwant %+v", p, tc.want)
			}
		})
	}
}

func TestFromDelivery(t *testing.T) {
	for _, tc := range []struct {
		name string
		d    amqp.Delivery
		want map[string]string
	}{
		{"no properties", amqp.Delivery{}, map[string]string{}},
		{"the relay's own and delivery mode are not headers",
			amqp.Delivery{MessageId: "m", DeliveryMode: 2, Headers: amqp.Table{"tenant": "acme"}}, map[string]string{}},
		{"every property, under AMQP's names",
			amqp.Delivery{ContentType: "application/json", ContentEncoding: "gzip", CorrelationId: "c-1", ReplyTo: "replies",
				Expiration: "60000", Priority: 9, Type: "order.placed", UserId: "billing", AppId: "shop"},
			map[string]string{"content-type": "application/json", "content-encoding": "gzip", "correlation-id": "c-1",
				"reply-to": "replies", "expiration": "60000", "priority": "9", "type": "order.placed", "user-id": "billing", "app-id": "shop"}},
		{"priority 0 is none", amqp.Delivery{Priority: 0, Type: "t"}, map[string]string{"type": "t"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := maps.Collect(FromDelivery(&tc.d))
			if !maps.Equal(got, tc.want) {
				t.Errorf("FromDelivery = %v, want %v", got, tc.want)
			}
		})
	}
}

// Each property of the table goes from a header to the property and back to
// the header of the same name: a message relayed from the outbox and the
// same message drained by backfill carry the same NATS headers.
func TestRoundTrip(t *testing.T) {
	for _, p := range headers.AMQPProperties {
		v := "v-" + p.Header
		if p.Kind != headers.ShortString {
			v = "42"
		}
		var pub amqp.Publishing
		if err := Fill(&pub, map[string]string{strings.ToUpper(p.Header): v}); err != nil {
			t.Fatalf("%s: %v", p.Header, err)
		}
		if pub.Headers != nil {
			t.Errorf("%s: left in the headers table %v", p.Header, pub.Headers)
		}
		// What a consumer gets: the same properties.
		d := amqp.Delivery{ContentType: pub.ContentType, ContentEncoding: pub.ContentEncoding, CorrelationId: pub.CorrelationId,
			ReplyTo: pub.ReplyTo, Expiration: pub.Expiration, Priority: pub.Priority, Type: pub.Type, UserId: pub.UserId, AppId: pub.AppId}
		if got := maps.Collect(FromDelivery(&d)); !maps.Equal(got, map[string]string{p.Header: v}) {
			t.Errorf("%s: back as %v, want %s: %s", p.Header, got, p.Header, v)
		}
	}
}
