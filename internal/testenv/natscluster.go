package testenv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a JetStream cluster of the test's own: nodes embedded in
// the test process on loopback, client and route ports picked free, each
// node's store under t.TempDir(). A node can be stopped and started again on
// the same ports and store directory (Stop, Start). Every node is shut down
// when the test ends.
//
// Stop is the server's Shutdown: it hands leadership of every Raft group
// the node leads to a current follower before closing (nats-server
// stepdownRaftNodes), so it is a graceful leader loss (a rolling restart),
// not a crash: after a crash the others elect a new leader only after their
// election timeout (4 to 9 s in nats-server 2.15).
type NATSCluster struct {
	t     testing.TB
	name  string
	nodes []*clusterNode
}

type clusterNode struct {
	name      string
	port      int
	routePort int
	dir       string
	srv       *natsserver.Server // nil while stopped
}

// NewNATSCluster starts an n-node JetStream cluster and waits until it has
// a meta leader and every node is current with it.
func NewNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	c := &NATSCluster{t: t, name: Name("js")}
	root := t.TempDir()
	for i := range n {
		c.nodes = append(c.nodes, &clusterNode{
			name: fmt.Sprintf("n%d", i+1), port: FreePort(t), routePort: FreePort(t),
			dir: filepath.Join(root, fmt.Sprintf("n%d", i+1)),
		})
	}
	for i := range c.nodes {
		c.Start(i)
	}
	c.WaitMetaLeader(30 * time.Second)
	return c
}

// opts are node i's options, built afresh for every start (the server keeps
// and changes the ones it is given).
func (c *NATSCluster) opts(i int) *natsserver.Options {
	n := c.nodes[i]
	var routes []string
	for j, o := range c.nodes {
		if j != i {
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.routePort))
		}
	}
	return &natsserver.Options{
		ServerName: n.name, Port: n.port,
		JetStream: true, StoreDir: n.dir,
		JetStreamMaxMemory: 64 << 20, JetStreamMaxStore: 1 << 30,
		Cluster: natsserver.ClusterOpts{Name: c.name, Host: "127.0.0.1", Port: n.routePort},
		Routes:  natsserver.RoutesFromStr(strings.Join(routes, ",")),
	}
}

// Start starts node i (again: same ports, same store directory).
func (c *NATSCluster) Start(i int) {
	c.t.Helper()
	if c.nodes[i].srv != nil {
		c.t.Fatalf("nats cluster: node %s already running", c.nodes[i].name)
	}
	c.nodes[i].srv = NATSServer(c.t, c.opts(i))
}

// Stop shuts node i down and waits until it has.
func (c *NATSCluster) Stop(i int) {
	c.t.Helper()
	s := c.nodes[i].srv
	if s == nil {
		c.t.Fatalf("nats cluster: node %s not running", c.nodes[i].name)
	}
	s.Shutdown()
	s.WaitForShutdown()
	c.nodes[i].srv = nil
}

// Server returns node i's server, nil while it is stopped.
func (c *NATSCluster) Server(i int) *natsserver.Server { return c.nodes[i].srv }

// NodeName returns node i's server name (what stream info's Cluster.Leader
// says).
func (c *NATSCluster) NodeName(i int) string { return c.nodes[i].name }

// Index returns the index of the node named name, or -1.
func (c *NATSCluster) Index(name string) int {
	for i, n := range c.nodes {
		if n.name == name {
			return i
		}
	}
	return -1
}

// URL returns node i's client URL.
func (c *NATSCluster) URL(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].port) }

// URLs returns every node's client URL, comma-separated (as RELAY_NATS_URL
// and nats.Connect take them).
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.nodes))
	for i := range c.nodes {
		urls[i] = c.URL(i)
	}
	return strings.Join(urls, ",")
}

// MetaLeader returns the index of the running node that is the JetStream
// meta leader, or -1 when none is (an election is under way).
func (c *NATSCluster) MetaLeader() int {
	for i, n := range c.nodes {
		if n.srv != nil && n.srv.JetStreamIsLeader() {
			return i
		}
	}
	return -1
}

// WaitMetaLeader waits until a running node is the meta leader and every
// running node is current with it, and returns the leader's index.
func (c *NATSCluster) WaitMetaLeader(timeout time.Duration) int {
	c.t.Helper()
	leader := -1
	Eventually(c.t, timeout, func() bool {
		if leader = c.MetaLeader(); leader < 0 {
			return false
		}
		for _, n := range c.nodes {
			if n.srv != nil && !n.srv.JetStreamIsCurrent() {
				return false
			}
		}
		return true
	}, "nats cluster: no meta leader with every node current")
	return leader
}

// StreamLeader returns the index of the node leading stream, fresh from
// stream info (Cluster.Leader); -1 with an error while it cannot be read.
func (c *NATSCluster) StreamLeader(ctx context.Context, js jetstream.JetStream, stream string) (int, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1, err
	}
	info := s.CachedInfo()
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return -1, errors.New("no leader")
	}
	return c.Index(info.Cluster.Leader), nil
}

// WaitStreamCurrent waits until stream has a leader and a current replica
// on every other node, and returns the leader's index.
func (c *NATSCluster) WaitStreamCurrent(js jetstream.JetStream, stream string, timeout time.Duration) int {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		leader, why := c.streamCurrent(js, stream)
		if why == "" {
			return leader
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("nats cluster: stream %s not current on every node after %v: %s", stream, timeout, why)
		}
		time.Sleep(10 * time.Millisecond) // polling interval
	}
}

// streamCurrent returns stream's leader, or why it is not current on
// every node.
func (c *NATSCluster) streamCurrent(js jetstream.JetStream, stream string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1, err.Error()
	}
	ci := s.CachedInfo().Cluster
	if ci == nil || ci.Leader == "" || len(ci.Replicas) != len(c.nodes)-1 {
		return -1, fmt.Sprintf("cluster info %+v", ci)
	}
	for _, r := range ci.Replicas {
		if !r.Current || r.Offline {
			return -1, fmt.Sprintf("replica %s current %v offline %v lag %d", r.Name, r.Current, r.Offline, r.Lag)
		}
	}
	return c.Index(ci.Leader), ""
}
