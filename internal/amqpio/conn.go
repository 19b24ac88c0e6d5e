// Package amqpio is the TCP connection under amqp091-go's: it reads in large
// chunks, and lets a batch of publishes leave in one write. amqp091-go reads
// through a 4 KiB buffer and flushes each publish on its own; on a small VM
// a system call costs tens of microseconds, and these were the largest
// single costs of the relay (one write per publish) and of the backfill (a
// read every three deliveries).
package amqpio

import (
	"cmp"
	"crypto/tls"
	"net"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// readBuffer is how much one read from the socket may take.
const readBuffer = 64 << 10

// Dial returns an amqp.Config Dial function whose connections are *Conn
// (amqp091-go puts TLS above it). wrap, when not nil, wraps the TCP
// connection first (tests); made is told each *Conn made.
func Dial(timeout time.Duration, wrap func(net.Conn) net.Conn, made func(*Conn)) func(network, addr string) (net.Conn, error) {
	dial := amqp.DefaultDial(timeout)
	return func(network, addr string) (net.Conn, error) {
		c, err := dial(network, addr)
		if err != nil {
			return nil, err
		}
		if wrap != nil {
			c = wrap(c)
		}
		cc := &Conn{Conn: c}
		if made != nil {
			made(cc)
		}
		return cc, nil
	}
}

// Conn is a connection that reads in large chunks and can be corked.
//
// Reads: amqp091-go's single reader goroutine is the only caller of Read,
// which serves it from a 64 KiB buffer filled by one read of the socket.
//
// Writes: between Cork and Uncork (a batch of publishes), writes collect
// in a buffer, sent at Uncork (or whenever it reaches 128 KiB). Every write
// goes through one mutex, so bytes leave in the order amqp091-go wrote
// them, whoever's goroutine they came from (heartbeats, other batches'
// publishes). A flush that fails leaves frames half sent, so it closes the
// connection: amqp091-go's reader then fails, and whoever waits for
// confirms sees the connection lost.
type Conn struct {
	net.Conn

	rbuf []byte // read buffer: rbuf[r:w] not yet returned
	r, w int

	mu    sync.Mutex
	corks int
	buf   []byte
	err   error // the first failed flush
}

// corkLimit is how much a cork holds before it writes anyway.
const corkLimit = 128 << 10

// WriteWait bounds every write that has no deadline of its own (writes
// outside a cork, and a cork's flush at corkLimit). A peer that stops
// reading (RabbitMQ blocks a publishing connection during a resource alarm)
// would otherwise hold the writer, and with it this connection's mutex and
// amqp091-go's, for as long as it does not read: every other publish and
// the heartbeats wait behind it. A write that times out closes the
// connection, as any failed write does.
var WriteWait = 10 * time.Second

func (c *Conn) Read(p []byte) (int, error) {
	if c.r == c.w {
		if len(p) >= readBuffer {
			return c.Conn.Read(p)
		}
		if c.rbuf == nil {
			c.rbuf = make([]byte, readBuffer)
		}
		n, err := c.Conn.Read(c.rbuf)
		c.r, c.w = 0, n
		if n == 0 {
			return 0, err
		}
		// An error with data comes again on the next read of the socket.
	}
	n := copy(p, c.rbuf[c.r:c.w])
	c.r += n
	return n, nil
}

func (c *Conn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.corks == 0 && len(c.buf) == 0 {
		c.Conn.SetWriteDeadline(time.Now().Add(WriteWait)) //nolint:errcheck // a conn that cannot take one fails the write below
		n, err := c.Conn.Write(p)
		c.Conn.SetWriteDeadline(time.Time{}) //nolint:errcheck // as above
		if err != nil {
			c.err = err
			c.Conn.Close()
		}
		return n, err
	}
	c.buf = append(c.buf, p...)
	if c.corks > 0 && len(c.buf) < corkLimit {
		return len(p), nil
	}
	if err := c.flushLocked(time.Time{}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Cork holds writes until the matching Uncork.
func (c *Conn) Cork() {
	c.mu.Lock()
	c.corks++
	c.mu.Unlock()
}

// Uncork ends a Cork and sends what has collected, whoever's it is, giving
// up at deadline (zero: after WriteWait).
func (c *Conn) Uncork(deadline time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corks--
	if c.err != nil {
		return c.err
	}
	return c.flushLocked(deadline)
}

func (c *Conn) flushLocked(deadline time.Time) error {
	if len(c.buf) == 0 {
		return nil
	}
	if deadline.IsZero() {
		deadline = time.Now().Add(WriteWait)
	}
	c.Conn.SetWriteDeadline(deadline) //nolint:errcheck // a conn that cannot take one fails the write below
	defer c.Conn.SetWriteDeadline(time.Time{})
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if err != nil {
		c.err = err
		c.Conn.Close()
	}
	return err
}

// DialOptions are what relayd's RabbitMQ connections differ in.
type DialOptions struct {
	TLS     *tls.Config   // nil: plain TCP (or whatever the amqps URL implies)
	Name    string        // connection_name, shown in the management UI
	Timeout time.Duration // TCP connect timeout; 10 s when zero
	// Wrap and Made are Dial's wrap and made (tests, corking).
	Wrap func(net.Conn) net.Conn
	Made func(*Conn)
}

// DialURL opens a RabbitMQ connection the way every relayd command does: a
// 10 s heartbeat, the TLS settings, and reads and writes through *Conn. url
// may list several nodes (SplitURLs): they are tried in order. A connection
// made again after a loss should go through one Nodes instead, which starts
// at the next node.
func DialURL(url string, o DialOptions) (*amqp.Connection, error) {
	conn, _, err := NewNodes(url).Dial(o)
	return conn, err
}

// config is the amqp.Config DialURL and Nodes.Dial connect with.
func (o DialOptions) config() amqp.Config {
	cfg := amqp.Config{
		Heartbeat:       10 * time.Second,
		TLSClientConfig: o.TLS,
		Dial:            Dial(cmp.Or(o.Timeout, 10*time.Second), o.Wrap, o.Made),
	}
	if o.Name != "" {
		cfg.Properties = amqp.Table{"connection_name": o.Name}
	}
	return cfg
}
