package integration

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// relayd started before Postgres and RabbitMQ accept connections (a compose
// or pod start) waits for them, up to RELAY_STARTUP_TIMEOUT, and starts.
func TestRelayWaitsForPostgresAndRabbitMQAtStart(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	late := func(name, rawURL string, after time.Duration) string {
		u, err := url.Parse(rawURL)
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		p := toxiproxy.NewProxy(toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), name, addr, u.Host)
		t.Cleanup(p.Stop)
		time.AfterFunc(after, func() {
			if err := p.Start(); err != nil {
				t.Errorf("start %s proxy: %v", name, err)
			}
		})
		u.Host = addr
		return u.String()
	}
	start := time.Now()
	// Postgres first, RabbitMQ two seconds later: each is waited for.
	e.startRelay("relayd", "RELAY_DATABASE_URL="+late("pg", e.dbURL, 2*time.Second),
		"RELAY_AMQP_URL="+late("amqp", e.amqpURL, 4*time.Second), "RELAY_STARTUP_TIMEOUT=20s")
	if waited := time.Since(start); waited < 4*time.Second {
		t.Fatalf("started after %v, before Postgres and RabbitMQ were reachable", waited)
	}
}
