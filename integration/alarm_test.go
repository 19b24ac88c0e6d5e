package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// A RabbitMQ memory alarm, a real one, on a RabbitMQ node of the test's own,
// for 5 s while rows flow in dual write: RabbitMQ blocks relayd's
// connection. /readyz says so, JetStream keeps getting every row, and once
// the alarm clears RabbitMQ gets the rest by itself — every committed row
// once in each broker, not a single RabbitMQ duplicate.
func TestRabbitMQAlarmDelaysButDoesNotDuplicate(t *testing.T) {
	// Not parallel: it measures how far JetStream gets in 5 s of alarm, and
	// beside the package's parallel tests the machine's two cores gave it
	// under 500 rows (1,150-1,270 alone).
	node := testenv.NewRabbitNode(t)
	e := newEnvAt(t, node.URL, testenv.NATSURL(t))
	metrics := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	r := startFaultRelay(e, "relay", "RELAY_PUBLISH_TIMEOUT=2s", "RELAY_METRICS_ADDR="+metrics)
	load := startFaultLoad(e, 1, 0, 10, 15*time.Millisecond, faultSeed(t))
	testenv.Eventually(t, 30*time.Second, func() bool { _, a, n := e.counts(); return a > 200 && n > 200 }, "no progress before the alarm")

	node.MemoryAlarm(true)
	var body string
	testenv.Eventually(t, 15*time.Second, func() bool {
		var code int
		code, body = readyz(metrics)
		return code == 503 && strings.Contains(body, "blocked")
	}, "/readyz does not say RabbitMQ blocked the connection: %v", lazyString(func() string { return body }))
	_, a0, n0 := e.counts()
	time.Sleep(5 * time.Second) // the alarm's length: pacing, not a wait for a result
	_, a1, n1 := e.counts()
	t.Logf("during 5 s of alarm: jetstream +%d rows, rabbitmq +%d", n1-n0, a1-a0)
	if n1-n0 < 500 {
		t.Errorf("jetstream got %d rows in 5 s of RabbitMQ alarm, want it to go on (about 300 rows/s)", n1-n0)
	}
	if a1 > a0 {
		t.Errorf("rabbitmq confirmed %d rows during its alarm, want none", a1-a0)
	}
	node.MemoryAlarm(false)
	healed := time.Now()

	committed := load.wait()
	e.waitDelivered(60 * time.Second)
	t.Logf("%d rows, all delivered %v after the alarm cleared", len(committed), time.Since(healed).Round(time.Millisecond))
	testenv.Eventually(t, 15*time.Second, func() bool { code, _ := readyz(metrics); return code == 200 }, "/readyz did not recover")
	if !r.running() {
		t.Fatalf("relayd exited:\n%s", r.out.String())
	}
	e.checkExactlyOnce(committed, false)
	if out := r.out.String(); !strings.Contains(out, "RabbitMQ blocked the connection") || !strings.Contains(out, "RabbitMQ unblocked the connection") {
		t.Errorf("relayd's log does not say RabbitMQ blocked and unblocked its connection:\n%s", out)
	}
}

// lazyString formats as f(), when the message is printed.
type lazyString func() string

func (l lazyString) String() string { return l() }
