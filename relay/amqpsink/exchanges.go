package amqpsink

import (
	"fmt"
	"sync"
	"time"

	"github.com/relayd/relayd/relay"
)

// exchangeSet is what a link found of the exchanges routes name. A publish
// to a missing exchange has RabbitMQ close the channel (404), failing every
// publish in flight on it; so an exchange is checked first, on a channel of
// its own, and a route's missing exchange holds only that route's rows.
type exchangeSet struct {
	mu      sync.Mutex           // never held across I/O: workers ask missing while corked
	found   map[string]bool      // exists; a publish after its deletion closes the channel: a new link checks again
	missing map[string]time.Time // said missing then; asked again after exchangeRecheck
}

// exchangeRecheck is how long a missing exchange's answer stands.
const exchangeRecheck = time.Second

// checkExchanges asks RabbitMQ about each exchange of names it has no
// answer for, before the batch's publishes go: not while corked, where its
// own frames would wait behind the cork.
func (l *link) checkExchanges(names map[string]struct{}) {
	if len(names) == 0 {
		return
	}
	e := &l.exchanges
	now := time.Now()
	var ask []string
	e.mu.Lock()
	for name := range names {
		if at, ok := e.missing[name]; !e.found[name] && (!ok || now.Sub(at) >= exchangeRecheck) {
			ask = append(ask, name)
		}
	}
	e.mu.Unlock()
	for _, name := range ask {
		exists, err := exchangeExists(l.conn, name)
		if err != nil {
			continue // the connection: the publish finds out
		}
		e.mu.Lock()
		if exists {
			if e.found == nil {
				e.found = map[string]bool{}
			}
			e.found[name] = true
			delete(e.missing, name)
		} else {
			if e.missing == nil {
				e.missing = map[string]time.Time{}
			}
			e.missing[name] = now
		}
		e.mu.Unlock()
	}
}

// exchangeMissing is the error of a publish to exchange name, which RabbitMQ
// said does not exist, or nil.
func (l *link) exchangeMissing(name string) error {
	e := &l.exchanges
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, ok := e.missing[name]; !ok {
		return nil
	}
	return relay.NoDestination(fmt.Errorf("amqp: exchange %q does not exist", name))
}
