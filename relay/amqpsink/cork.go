package amqpsink

import (
	"net"
	"sync"
	"time"
)

// corkConn lets a batch's publishes leave in one write. amqp091-go flushes
// each publish on its own (method, header and body frames: one write), and
// on a small VM a write costs tens of microseconds of system time: at a few
// rows a batch, the publishes' writes were the largest single cost of the
// relay. While corked, writes collect in a buffer; uncork sends it. Every
// write goes through the one mutex, so bytes leave in the order amqp091-go
// wrote them, whoever's goroutine they came from (heartbeats, other
// workers' publishes).
//
// A flush that fails leaves frames half sent, so it closes the connection:
// amqp091-go's reader then fails, and the session resolves every pending
// publish as unknown (retried), as for any lost connection.
type corkConn struct {
	net.Conn

	mu    sync.Mutex
	corks int
	buf   []byte
	err   error // the first failed flush
}

// corkLimit is how much a cork holds before it writes anyway.
const corkLimit = 128 << 10

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if c.corks == 0 && len(c.buf) == 0 {
		return c.Conn.Write(p)
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

// cork holds writes until the matching uncork.
func (c *corkConn) cork() {
	c.mu.Lock()
	c.corks++
	c.mu.Unlock()
}

// uncork ends a cork and sends what has collected, whoever's it is, giving
// up at deadline (zero: none).
func (c *corkConn) uncork(deadline time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corks--
	if c.err != nil {
		return c.err
	}
	return c.flushLocked(deadline)
}

func (c *corkConn) flushLocked(deadline time.Time) error {
	if len(c.buf) == 0 {
		return nil
	}
	if !deadline.IsZero() {
		c.Conn.SetWriteDeadline(deadline) //nolint:errcheck // a conn that cannot take one fails the write below
		defer c.Conn.SetWriteDeadline(time.Time{})
	}
	_, err := c.Conn.Write(c.buf)
	c.buf = c.buf[:0]
	if err != nil {
		c.err = err
		c.Conn.Close()
	}
	return err
}
