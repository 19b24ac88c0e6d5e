package relay

import (
	"strings"
	"testing"
	"time"
)

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	a := newFake(TargetAMQP)
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no sinks", Config{}, "no sinks"},
		{"two amqp", Config{Sinks: []Sink{a, newFake(TargetAMQP)}}, "two sinks"},
		{"unknown target", Config{Sinks: []Sink{newFake("kafka")}}, "unknown target"},
		{"batch", Config{Sinks: []Sink{a}, BatchSize: -1}, "BatchSize"},
		{"workers", Config{Sinks: []Sink{a}, Workers: 1000}, "Workers"},
		{"retry", Config{Sinks: []Sink{a}, RetryMin: time.Minute, RetryMax: time.Second}, "RetryMax"},
	} {
		if _, err := New(nil, tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: New error %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
}
