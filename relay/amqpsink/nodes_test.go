package amqpsink_test

import (
	"encoding/json"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/relay/amqpsink"
	"github.com/relayd/relayd/relay/sinktest"
)

// A URL list of two "nodes" (two proxies in front of the one RabbitMQ): the
// sink connects to the first; when that one goes, it reconnects to the
// second, and when the second goes, to the first again. Every message
// published between the losses arrives once.
func TestReconnectsToTheNextNode(t *testing.T) {
	t.Parallel()
	rawURL := testenv.AMQPURL(t)
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	second := toxiproxy.NewProxy(srv, testenv.Name("second"), "127.0.0.1:0", u.Host)
	if err := second.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Stop)
	u.Host = second.Listen

	var log testenv.SyncBuffer
	var first string // the first node's host:port: the proxy setupAt puts in front
	e := setupReadyWith(t, func(c *amqpsink.Config) {
		f, _ := url.Parse(c.URL)
		first = f.Host
		c.URL += " , " + u.String()
		c.Logger = slog.New(slog.NewJSONHandler(&log, nil))
	})
	// connected reports whether the sink has logged msg with node.
	connected := func(msg, node string) bool {
		for _, line := range strings.Split(strings.TrimSpace(log.String()), "\n") {
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == msg && rec["node"] == node {
				return true
			}
		}
		return false
	}
	if !connected("amqp connected", first) {
		t.Fatalf("the sink did not log connecting to the first node %s:\n%s", first, log.String())
	}
	var all []*relay.Message
	publish := func(round string) {
		t.Helper()
		msgs := sinktest.Messages(round, 20)
		testenv.Eventually(t, 15*time.Second, func() bool { return e.sink.Ready() == nil }, "sink not Ready for %s", round)
		sinktest.RequireAllNil(t, msgs, sinktest.Publish(t, e.sink, 15*time.Second, msgs))
		all = append(all, msgs...)
	}
	publish("on-first")

	e.Down(t) // the first node goes
	testenv.Eventually(t, 15*time.Second, func() bool { return connected("amqp reconnected", second.Listen) },
		"no reconnect to the second node %s: %v", second.Listen, logText{&log})
	publish("on-second")

	e.Up(t)
	second.Stop() // and now the second: back to the first
	testenv.Eventually(t, 15*time.Second, func() bool {
		return strings.Count(log.String(), `"msg":"amqp reconnected"`) >= 2 && connected("amqp reconnected", first)
	}, "no reconnect to the first node %s: %v", first, logText{&log})
	publish("on-first-again")

	sinktest.RequireCounts(t, sinktest.Settle(t, e.sink, e), all, 1)
}

// logText prints the log when a failure message is formatted.
type logText struct{ l *testenv.SyncBuffer }

func (l logText) String() string { return l.l.String() }
