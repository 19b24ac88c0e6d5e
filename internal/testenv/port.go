package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"testing"
)

// freePorts are the ports FreePort handed out in this process.
var freePorts struct {
	sync.Mutex
	given map[int]bool
}

// FreePort returns a TCP port on loopback that was free a moment ago, and
// that this process has not handed out before. It picks below the kernel's
// ephemeral range: a port from ":0" is one the machine's outgoing
// connections take too, and one taken between the check and a test
// server's bind failed a NATS cluster node's start.
func FreePort(t testing.TB) int {
	t.Helper()
	freePorts.Lock()
	defer freePorts.Unlock()
	if freePorts.given == nil {
		freePorts.given = map[int]bool{}
	}
	const low = 10000
	if high := ephemeralLow(); high > low+1000 {
		for range 100 {
			p := low + rand.IntN(high-low)
			if freePorts.given[p] {
				continue
			}
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				continue
			}
			l.Close()
			freePorts.given[p] = true
			return p
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	p := l.Addr().(*net.TCPAddr).Port
	freePorts.given[p] = true
	return p
}

// ephemeralLow is the first port of the kernel's ephemeral range (Linux),
// or 0 when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0
	}
	return lo
}
