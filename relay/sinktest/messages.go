package sinktest

import (
	"fmt"
	"time"

	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/relay"
)

// Messages returns n messages with distinct ids (fresh for every call),
// topics under TopicPrefix, a traceparent and other headers, and distinct
// payloads with bytes that text handling would mangle. Every tenth has no
// headers and an empty payload.
func Messages(name string, n int) []*relay.Message {
	base := testenv.Name(name)
	msgs := make([]*relay.Message, n)
	for i := range msgs {
		m := &relay.Message{
			ID:        int64(i + 1),
			MessageID: fmt.Sprintf("%s-%04d", base, i),
			Topic:     fmt.Sprintf("%s%s.t%d", TopicPrefix, name, i%4),
			CreatedAt: time.Now(),
		}
		if i%10 != 9 {
			m.Headers = map[string]string{
				"traceparent": Traceparent,
				"x-index":     fmt.Sprint(i),
				"x-text":      "grüße ✓",
			}
			m.Payload = append([]byte(fmt.Sprintf(`{"i":%d}`, i)), 0x00, 0xff, '\r', '\n')
		}
		msgs[i] = m
	}
	return msgs
}
