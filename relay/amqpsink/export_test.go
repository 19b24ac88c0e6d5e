package amqpsink

import "net"

// WrapConn has every connection the sink dials wrapped by f, below the cork:
// f's conn sees the writes that reach the socket.
func WrapConn(cfg *Config, f func(net.Conn) net.Conn) { cfg.wrapConn = f }

// BeforeEvent has f run on the sink's event goroutine before each return or
// confirm is applied.
func BeforeEvent(cfg *Config, f func()) { cfg.beforeEvent = f }
