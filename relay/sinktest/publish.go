package sinktest

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/relayd/relayd/relay"
)

// errNotSet prefills results: a sink must set every result.
var errNotSet = errors.New("sinktest: result not set by Publish")

// Publish calls sink.Publish under a ctx of timeout and returns the
// results. It fails the test if Publish panics, or is still running grace
// after the deadline.
func Publish(t *testing.T, sink relay.Sink, timeout time.Duration, msgs []*relay.Message) []error {
	t.Helper()
	results, problem := publish(sink, timeout, msgs)
	if problem != "" {
		t.Fatalf("Publish of %d messages: %s", len(msgs), problem)
	}
	return results
}

// publish is Publish without t, for other goroutines. problem is non-empty
// when Publish panicked or hung.
func publish(sink relay.Sink, timeout time.Duration, msgs []*relay.Message) (results []error, problem string) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	results = make([]error, len(msgs))
	for i := range results {
		results[i] = errNotSet
	}
	done := make(chan string, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				done <- fmt.Sprintf("panicked: %v", r)
			}
		}()
		sink.Publish(ctx, msgs, results)
		done <- ""
	}()
	timer := time.NewTimer(timeout + grace)
	defer timer.Stop()
	select {
	case problem = <-done:
		if problem != "" {
			return nil, problem
		}
		return results, ""
	case <-timer.C:
		// The results slice stays with the hung call: it may still write.
		return nil, fmt.Sprintf("still running %v after its ctx deadline (%v); goroutines:\n%s", grace, timeout, goroutines())
	}
}

// goroutines is a dump of every goroutine, to show where a hung Publish is
// stuck, capped at 256 KiB.
func goroutines() []byte {
	buf := make([]byte, 256<<10)
	return buf[:runtime.Stack(buf, true)]
}
