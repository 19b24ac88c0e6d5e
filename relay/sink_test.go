package relay

import (
	"fmt"
	"testing"
)

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
