package amqpio

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// SplitURLs splits a RabbitMQ node list (RELAY_AMQP_URL): URLs separated by
// commas, spaces around them and empty entries (a trailing comma) allowed.
// A comma ends a URL only where another follows it (amqp:// or amqps://,
// after spaces and commas) or nothing does, so a comma in a password stays
// the password's, as it was when the variable held one URL.
func SplitURLs(s string) []string {
	var urls []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] != ',' {
			continue
		}
		rest := strings.TrimLeft(s[i+1:], " \t,")
		if rest != "" && !strings.HasPrefix(rest, "amqp://") && !strings.HasPrefix(rest, "amqps://") {
			continue
		}
		if u := strings.TrimSpace(s[start:i]); u != "" {
			urls = append(urls, u)
		}
		start = i + 1
	}
	if u := strings.TrimSpace(s[start:]); u != "" {
		urls = append(urls, u)
	}
	return urls
}

// Nodes dials the nodes of a RabbitMQ cluster. The first dial tries them in
// the list's order; each later one starts at the node after the one it last
// connected to, so a connection lost with its node is made again on another
// (round-robin, as nats.go does with a server list). Safe for concurrent use.
type Nodes struct {
	urls []string

	mu   sync.Mutex
	next int // the node the next Dial tries first

	// dial is amqp.DialConfig; unit tests replace it.
	dial func(url string, cfg amqp.Config) (*amqp.Connection, error)
}

// NewNodes returns the nodes of list, a RELAY_AMQP_URL (see SplitURLs).
func NewNodes(list string) *Nodes {
	return &Nodes{urls: SplitURLs(list), dial: amqp.DialConfig}
}

// Len is how many nodes there are.
func (n *Nodes) Len() int { return len(n.urls) }

// Dial connects to the first node that lets it, from the one after the node
// last connected to, and returns the connection and that node's address
// (host:port, no credentials: fit for logs). When every node fails, the
// error has each node's (a single node's error is returned as it is).
func (n *Nodes) Dial(o DialOptions) (*amqp.Connection, string, error) {
	if len(n.urls) == 0 {
		return nil, "", errors.New("amqp: no RabbitMQ URL")
	}
	n.mu.Lock()
	from := n.next
	n.mu.Unlock()
	var errs []error
	for k := range n.urls {
		i := (from + k) % len(n.urls)
		conn, err := n.dial(n.urls[i], o.config())
		if err == nil {
			n.mu.Lock()
			n.next = (i + 1) % len(n.urls)
			n.mu.Unlock()
			return conn, nodeAddr(n.urls[i], i), nil
		}
		if len(n.urls) == 1 {
			return nil, "", err
		}
		errs = append(errs, fmt.Errorf("node %d of %d (%s): %w", i+1, len(n.urls), nodeAddr(n.urls[i], i), err))
	}
	return nil, "", nodeErrors(errs)
}

// nodeErrors is every node's dial error, on one line (errors.Join's take
// one each).
type nodeErrors []error

func (e nodeErrors) Error() string {
	msgs := make([]string, len(e))
	for i, err := range e {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e nodeErrors) Unwrap() []error { return e }

// nodeAddr is the host:port of the node at url (index i of the list), or
// "node i+1" if url does not parse: never its credentials.
func nodeAddr(url string, i int) string {
	u, err := amqp.ParseURI(url)
	if err != nil {
		return "node " + strconv.Itoa(i+1)
	}
	return net.JoinHostPort(u.Host, strconv.Itoa(u.Port))
}
