package sinktest

import (
	"errors"
	"fmt"
	"testing"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// outage is the state the Outage subtest carries from BrokerDown to
// BrokerBack.
type outage struct {
	sink relay.Sink
	b    Broker
	warm []*relay.Message // confirmed before the outage
	// wentDown is set once Down returned (it may skip instead).
	wentDown bool
	// confirmed are the messages of the publish the outage cut into that
	// the sink confirmed all the same.
	confirmed []*relay.Message
}

// The broker goes away and comes back under one sink.
func testOutage(t *testing.T, h Harness) {
	sink, b := newReady(t, h)
	o := &outage{sink: sink, b: b, warm: Messages("warm", 1)}
	RequireAllNil(t, o.warm, Publish(t, sink, publishTimeout, o.warm))
	WaitArrived(t, b, o.warm)

	t.Run("BrokerDown", func(t *testing.T) {
		o.cutInFlight(t)
		o.whileDown(t)
	})
	t.Run("BrokerBack", o.back)
}

// cutInFlight takes the broker away while a publish waits for its
// verdicts: the publish returns within its deadline, each message either
// confirmed or "unknown".
func (o *outage) cutInFlight(t *testing.T) {
	inflight := Messages("inflight", 1000)
	type outcome struct {
		results []error
		problem string
	}
	done := make(chan outcome, 1)
	go func() {
		r, p := publish(o.sink, outageTimeout, inflight)
		done <- outcome{r, p}
	}()
	// Down may skip (Goexit): the publish is still waited for.
	received := false
	defer func() {
		if !received {
			<-done
		}
	}()
	o.waitFirstArrived(t, inflight)
	o.b.Down(t)
	o.wentDown = true
	res := <-done
	received = true
	if res.problem != "" {
		t.Fatalf("Publish of %d messages cut by the outage: %s", len(inflight), res.problem)
	}
	o.sortCut(t, inflight, res.results)
}

// waitFirstArrived waits until the first of msgs reached the broker, so
// that the outage cuts into a publish under way.
func (o *outage) waitFirstArrived(t *testing.T, msgs []*relay.Message) {
	testenv.Eventually(t, arriveTimeout, func() bool {
		got := o.b.Received(t)
		for _, m := range msgs {
			if len(got[m.MessageID]) > 0 {
				return true
			}
		}
		return false
	}, "none of %d messages published reached the broker", len(msgs))
}

// sortCut keeps the confirmed messages of the cut publish and fails on any
// result that is neither nil nor "unknown".
func (o *outage) sortCut(t *testing.T, msgs []*relay.Message, results []error) {
	unknown := 0
	for i, err := range results {
		switch {
		case err == nil:
			o.confirmed = append(o.confirmed, msgs[i])
		case errors.Is(err, relay.ErrUnavailable):
			unknown++
		default:
			t.Errorf("message %s cut by the outage: result %v (%T), want nil or an error wrapping relay.ErrUnavailable", msgs[i].MessageID, err, err)
		}
	}
	t.Logf("publish cut by the outage: %d confirmed, %d unknown", len(o.confirmed), unknown)
}

// whileDown publishes to the down broker, before and after the sink may
// have noticed: every message is "unknown", within the deadline, and
// Ready reports the broker unavailable.
func (o *outage) whileDown(t *testing.T) {
	// At once, before the sink may have noticed: no verdict can come,
	// so every message is "unknown", within the deadline.
	msgs := Messages("down1", 20)
	RequireAllUnavailable(t, msgs, Publish(t, o.sink, outageTimeout, msgs))

	var last error
	testenv.Eventually(t, readyTimeout, func() bool { last = o.sink.Ready(); return last != nil },
		"Ready() still nil after the broker went down")
	if !errors.Is(last, relay.ErrUnavailable) {
		t.Fatalf("Ready() = %v while the broker is down, want an error wrapping relay.ErrUnavailable", last)
	}

	msgs = Messages("down2", 20)
	RequireAllUnavailable(t, msgs, Publish(t, o.sink, outageTimeout, msgs))
	if err := o.sink.Ready(); !errors.Is(err, relay.ErrUnavailable) {
		t.Fatalf("Ready() = %v after publishing to a down broker, want an error wrapping relay.ErrUnavailable", err)
	}
}

// back brings the broker back: the sink reconnects by itself, publishes
// again, and nothing it confirmed before or during the outage is lost.
func (o *outage) back(t *testing.T) {
	if !o.wentDown {
		t.Skip("the broker never went down")
	}
	o.b.Up(t)
	testenv.Eventually(t, reconnectLimit, func() bool { return o.sink.Ready() == nil },
		"Ready() = %v: the sink did not reconnect by itself", lazy(func() string { return fmt.Sprint(o.sink.Ready()) }))

	msgs := Messages("back", 10)
	RequireAllNil(t, msgs, Publish(t, o.sink, publishTimeout, msgs))
	got := WaitArrived(t, o.b, msgs)
	for _, m := range msgs {
		if n := len(got[m.MessageID]); n != 1 {
			t.Errorf("message %s published after the outage is at the broker %d times, want 1", m.MessageID, n)
		}
	}
	// What was confirmed before or during the outage is still there:
	// a confirm is a promise.
	WaitArrived(t, o.b, append(o.confirmed, o.warm...))
}
