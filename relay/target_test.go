package relay

import (
	"fmt"
	"testing"
)

func TestPerTargetAndPhase(t *testing.T) {
	t.Parallel()
	var p perTarget[int]
	p.Set(TargetNATS, 2)
	*p.Ptr(TargetAMQP) = 1
	if p.Get(TargetAMQP) != 1 || p.Get(TargetNATS) != 2 || p != (perTarget[int]{AMQP: 1, NATS: 2}) {
		t.Fatalf("perTarget %+v, want amqp 1, nats 2", p)
	}
	var order []Target
	p.Each(func(tg Target, _ int) { order = append(order, tg) })
	if len(order) != 2 || order[0] != TargetAMQP || order[1] != TargetNATS {
		t.Fatalf("Each in order %v, want Targets' order", order)
	}
	for _, tc := range []struct {
		amqp, nats    bool
		any, natsOnly bool
		targets       int
	}{
		{false, false, false, false, 0},
		{true, false, true, false, 1},
		{false, true, true, true, 1},
		{true, true, true, false, 2},
	} {
		ph := phase{perTarget[bool]{AMQP: tc.amqp, NATS: tc.nats}}
		if ph.Any() != tc.any || ph.NATSOnly() != tc.natsOnly || len(ph.targets()) != tc.targets || ph.Has(TargetNATS) != tc.nats {
			t.Errorf("phase amqp=%v nats=%v: Any %v NATSOnly %v targets %v", tc.amqp, tc.nats, ph.Any(), ph.NATSOnly(), ph.targets())
		}
	}
}

func TestParseTargets(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"amqp": "[amqp]", "nats": "[nats]", "amqp,nats": "[amqp nats]", "nats, amqp": "[amqp nats]",
	} {
		got, err := ParseTargets(in)
		if err != nil || fmt.Sprint(got) != want {
			t.Errorf("ParseTargets(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "bogus", "amqp,amqp", "amqp,", "kafka,nats"} {
		if _, err := ParseTargets(in); err == nil {
			t.Errorf("ParseTargets(%q) accepted", in)
		}
	}
}
