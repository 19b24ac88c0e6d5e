package amqpsink

import (
	"bytes"
	"context"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/amqpio"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

func TestPublishingMovesPropertyHeaders(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	base := amqp.Publishing{DeliveryMode: amqp.Persistent, MessageId: "m-1", Timestamp: created, Body: []byte("{}")}
	with := func(f func(*amqp.Publishing)) amqp.Publishing { p := base; f(&p); return p }
	for _, tc := range []struct {
		name    string
		headers map[string]string
		want    amqp.Publishing
	}{
		{"no headers: the relay's properties alone", nil, base},
		{"plain headers: the table", map[string]string{"tenant": "acme"},
			with(func(p *amqp.Publishing) { p.Headers = amqp.Table{"tenant": "acme"} })},
		{"Content-Type and correlation-id: properties, not headers", map[string]string{"Content-Type": "application/json", "correlation-id": "c-1", "tenant": "acme"},
			with(func(p *amqp.Publishing) {
				p.ContentType, p.CorrelationId, p.Headers = "application/json", "c-1", amqp.Table{"tenant": "acme"}
			})},
		{"type, priority, reply-to, app-id", map[string]string{"type": "order.placed", "Priority": "5", "reply-to": "r", "app-id": "shop"},
			with(func(p *amqp.Publishing) { p.Type, p.Priority, p.ReplyTo, p.AppId = "order.placed", 5, "r", "shop" })},
		{"message-id and timestamp headers do not replace the relay's", map[string]string{"message-id": "other", "timestamp": "0"},
			with(func(p *amqp.Publishing) { p.Headers = amqp.Table{"message-id": "other", "timestamp": "0"} })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &relay.Message{MessageID: "m-1", Topic: "t", Headers: tc.headers, Payload: []byte("{}"), CreatedAt: created}
			got, err := checkedPublishing(m, 131072, "relayd")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) || !reflect.DeepEqual(Publishing(m), tc.want) {
				t.Errorf("publishing:\n got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

// What checkedPublishing parks, and why: each would have RabbitMQ close the
// channel or amqp091-go the connection, failing every publish in flight.
func TestCheckedPublishingRefuses(t *testing.T) {
	for _, tc := range []struct {
		name    string
		headers map[string]string
		user    string // the connection's
		reason  string // a part of it; "" for none
	}{
		{"user-id of the connection's user", map[string]string{"user-id": "relayd"}, "relayd", ""},
		{"another user-id", map[string]string{"user-id": "billing"}, "relayd", `user-id "billing" is not "relayd", the user relayd connects as`},
		{"a user-id in another case", map[string]string{"User-Id": "Relayd"}, "relayd", `user-id "Relayd" is not "relayd"`},
		{"a user-id, the connection's user unknown (EXTERNAL)", map[string]string{"user-id": "relayd"}, "", "cannot tell its user name"},
		{"no user-id, the connection's user unknown", map[string]string{"type": "t"}, "", ""},
		{"a priority over 255", map[string]string{"priority": "256"}, "relayd", `value of "priority" is "256"`},
		{"an expiration that is not milliseconds", map[string]string{"expiration": "1.5"}, "relayd", "closes the channel"},
		{"a property over 255 bytes", map[string]string{"Type": strings.Repeat("t", 256)}, "relayd", `value of "Type" is 256 bytes`},
		{"one property, two values", map[string]string{"type": "a", "TYPE": "b"}, "relayd", `headers ["TYPE" "type"] all set the AMQP type`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &relay.Message{MessageID: "m", Topic: "t", Headers: tc.headers}
			_, err := checkedPublishing(m, 131072, tc.user)
			switch {
			case tc.reason == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.reason != "" && (!relay.IsPermanent(err) || !strings.Contains(err.Error(), tc.reason)):
				t.Fatalf("error %v, want a permanent one saying %q", err, tc.reason)
			}
		})
	}
}

// contentHeaderSize is the size amqp091-go writes, property for property,
// so that a message over frame_max is parked rather than sent.
func TestContentHeaderSizeIsExact(t *testing.T) {
	url := testenv.AMQPURL(t)
	uri, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wire bytes.Buffer
	conn, err := amqp.DialConfig(url, amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		c, err := net.DialTimeout(network, addr, 10*time.Second)
		if err != nil {
			return nil, err
		}
		return recorder{Conn: c, mu: &mu, buf: &wire}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	all := map[string]string{
		"content-type": "application/json", "content-encoding": "gzip", "correlation-id": "c-1", "reply-to": "replies",
		"expiration": "60000", "priority": "7", "type": "order.placed", "user-id": uri.Username, "app-id": "shop",
		"tenant": "acme", "x-long": strings.Repeat("x", 1000),
	}
	for _, h := range []map[string]string{nil, {"tenant": "acme"}, all} {
		m := &relay.Message{MessageID: "6f1c7a4e-0b55-4a8e-9d0e-3f3f8c2a9b10", Topic: "t", Headers: h, Payload: []byte("x"), CreatedAt: time.Now()}
		pub, err := checkedPublishing(m, conn.Config.FrameSize, connUser(conn))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		wire.Reset()
		mu.Unlock()
		// amq.topic exists everywhere; unroutable is fine, the frames are what count.
		confirm, err := ch.PublishWithDeferredConfirmWithContext(context.Background(), "amq.topic", "relayd.size.test", false, false, pub)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, err := confirm.WaitContext(ctx)
		cancel()
		if !ok || err != nil {
			t.Fatalf("headers %v: not confirmed (%v): RabbitMQ refused the properties", h, err)
		}
		mu.Lock()
		size, found := contentHeaderPayload(wire.Bytes())
		mu.Unlock()
		if !found {
			t.Fatalf("headers %v: no content header on the wire", h)
		}
		if got := contentHeaderSize(&pub); got != size {
			t.Errorf("headers %v: contentHeaderSize %d, amqp091-go wrote %d", h, got, size)
		}
	}
}

// contentHeaderPayload is the payload size of the first content header frame
// in b, frames as amqp091-go writes them.
func contentHeaderPayload(b []byte) (int, bool) {
	for len(b) >= 8 {
		size := int(b[3])<<24 | int(b[4])<<16 | int(b[5])<<8 | int(b[6])
		if len(b) < 8+size {
			return 0, false
		}
		if b[0] == 2 {
			return size, true
		}
		b = b[8+size:]
	}
	return 0, false
}

type recorder struct {
	net.Conn
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (c recorder) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(p)
	c.mu.Unlock()
	return c.Conn.Write(p)
}

// The user the sink checks a user-id against is the URL's, and "guest"
// when it names none, as amqp091-go logs in.
func TestConnUser(t *testing.T) {
	url := testenv.AMQPURL(t)
	uri, err := amqp.ParseURI(url)
	if err != nil {
		t.Fatal(err)
	}
	urls := []string{url}
	if uri.Username == "guest" && uri.Password == "guest" {
		urls = append(urls, strings.Replace(url, "guest:guest@", "", 1))
	}
	for _, u := range urls {
		conn, err := amqpio.DialURL(u, amqpio.DialOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := connUser(conn)
		conn.Close()
		if got != uri.Username {
			t.Errorf("connUser on %s = %q, want %q", strings.ReplaceAll(u, uri.Password, "…"), got, uri.Username)
		}
	}
}

// Publishing runs once per row and publish: a row's usual headers, one of
// them a property.
func BenchmarkPublishing(b *testing.B) {
	m := &relay.Message{MessageID: "6f1c7a4e-0b55-4a8e-9d0e-3f3f8c2a9b10", Topic: "orders.placed", CreatedAt: time.Now(), Payload: []byte("{}"),
		Headers: map[string]string{"content-type": "application/json", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "acme"}}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := checkedPublishing(m, 131072, "relayd"); err != nil {
			b.Fatal(err)
		}
	}
}
