package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a JetStream cluster of the test's own on loopback: nodes
// embedded in the test process (NewNATSCluster) or nats-server processes
// (NewNATSClusterProcs), client and route ports picked free, each node's
// store under t.TempDir(). A node can be stopped and started again on the
// same ports and store directory (Stop, Start). Every node is shut down
// when the test ends.
//
// Stop is the server's Shutdown (a process: SIGTERM): it hands leadership of
// every Raft group the node leads to a current follower before closing
// (nats-server stepdownRaftNodes), so it is a graceful leader loss (a rolling
// restart), not a crash. Kill, for processes, is the crash: the others elect
// a new leader only after their election timeout (4 to 9 s in nats-server
// 2.15).
type NATSCluster struct {
	t     testing.TB
	name  string
	bin   string // the nats-server binary nodes run as processes; "": embedded
	root  string
	nodes []*clusterNode
}

type clusterNode struct {
	name      string
	port      int
	routePort int
	monPort   int // HTTP monitoring, processes only
	dir       string
	srv       *natsserver.Server // embedded: nil while stopped
	proc      *exec.Cmd          // process: nil while stopped
	exited    chan struct{}
}

// NewNATSCluster starts an n-node JetStream cluster embedded in the test
// process and waits until it has a meta leader and every node is current
// with it.
func NewNATSCluster(t testing.TB, n int) *NATSCluster {
	t.Helper()
	return newNATSCluster(t, n, "")
}

// NewNATSClusterProcs is NewNATSCluster with each node a nats-server process
// of its own (bin, see NATSServerBinary), so that Kill is a real SIGKILL.
func NewNATSClusterProcs(t testing.TB, n int, bin string) *NATSCluster {
	t.Helper()
	return newNATSCluster(t, n, bin)
}

func newNATSCluster(t testing.TB, n int, bin string) *NATSCluster {
	t.Helper()
	c := &NATSCluster{t: t, name: Name("js"), bin: bin, root: t.TempDir()}
	for i := range n {
		c.nodes = append(c.nodes, &clusterNode{
			name: fmt.Sprintf("n%d", i+1), port: FreePort(t), routePort: FreePort(t), monPort: FreePort(t),
			dir: filepath.Join(c.root, fmt.Sprintf("n%d", i+1)),
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

func (n *clusterNode) running() bool { return n.srv != nil || n.proc != nil }

// Start starts node i (again: same ports, same store directory).
func (c *NATSCluster) Start(i int) {
	c.t.Helper()
	n := c.nodes[i]
	if n.running() {
		c.t.Fatalf("nats cluster: node %s already running", n.name)
	}
	if c.bin == "" {
		n.srv = NATSServer(c.t, c.opts(i))
		return
	}
	c.startProc(i)
}

// Stop shuts node i down and waits until it has: Shutdown, or for a
// process SIGTERM (the same shutdown, handing leadership over).
func (c *NATSCluster) Stop(i int) {
	c.t.Helper()
	n := c.nodes[i]
	switch {
	case n.srv != nil:
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	case n.proc != nil:
		c.signal(i, syscall.SIGTERM)
	default:
		c.t.Fatalf("nats cluster: node %s not running", n.name)
	}
}

// Kill SIGKILLs node i's process and waits for it to exit: a crash. Only
// for a cluster of processes.
func (c *NATSCluster) Kill(i int) {
	c.t.Helper()
	if c.nodes[i].proc == nil {
		c.t.Fatalf("nats cluster: node %s is not a running process", c.nodes[i].name)
	}
	c.signal(i, syscall.SIGKILL)
}

func (c *NATSCluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	n := c.nodes[i]
	n.proc.Process.Signal(sig) //nolint:errcheck // exited already: waited for below
	select {
	case <-n.exited:
	case <-time.After(30 * time.Second):
		n.proc.Process.Kill() //nolint:errcheck // the test fails anyway
		<-n.exited
		c.t.Fatalf("nats cluster: node %s did not exit within 30s of %v", n.name, sig)
	}
	n.proc = nil
}

// startProc starts node i as a nats-server process with a config file of
// its own, and waits until it answers on its client port.
func (c *NATSCluster) startProc(i int) {
	c.t.Helper()
	n := c.nodes[i]
	var routes []string
	for j, o := range c.nodes {
		if j != i {
			routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", o.routePort))
		}
	}
	conf := fmt.Sprintf(`server_name: %s
listen: "127.0.0.1:%d"
http: "127.0.0.1:%d"
jetstream { store_dir: %q, max_memory_store: 64MB, max_file_store: 1GB }
cluster { name: %s, listen: "127.0.0.1:%d", routes: [%s] }
`, n.name, n.port, n.monPort, n.dir, c.name, n.routePort, strings.Join(routes, ", "))
	path := filepath.Join(c.root, n.name+".conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command(c.bin, "-c", path)
	dieWithTest(cmd)
	log, err := os.OpenFile(filepath.Join(c.root, n.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("nats cluster: start %s: %v", n.name, err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }() //nolint:errcheck // a killed node exits non-zero
	n.proc, n.exited = cmd, exited
	c.t.Cleanup(func() { cmd.Process.Kill(); <-exited }) //nolint:errcheck // may have exited
	Eventually(c.t, 30*time.Second, func() bool {
		select {
		case <-exited:
			b, _ := os.ReadFile(filepath.Join(c.root, n.name+".log"))
			c.t.Fatalf("nats cluster: %s exited at start:\n%s", n.name, b)
		default:
		}
		return reachable(c.URL(i))
	}, "nats cluster: %s not listening", n.name)
}

// jsz is the part of a node's /jsz the cluster reads.
type jsz struct {
	Meta *struct {
		Leader string `json:"leader"`
	} `json:"meta_cluster"`
}

// monitor GETs path from node i's monitoring port; ok is false for an error
// or a status other than 200.
func (c *NATSCluster) monitor(i int, path string, v any) bool {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get(fmt.Sprintf("http://127.0.0.1:%d%s", c.nodes[i].monPort, path))
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	return v == nil || json.NewDecoder(resp.Body).Decode(v) == nil
}

// NATSServerBinary builds nats-server from the module this repository
// requires (go.mod), into a directory of the test's own, and returns its
// path. The Go build cache makes every build after the first a link.
func NATSServerBinary(t testing.TB) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "nats-server")
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Dir = filepath.Dir(file)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build nats-server: %v\n%s", err, out)
	}
	return bin
}

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
		var z jsz
		if n.proc != nil && c.monitor(i, "/jsz", &z) && z.Meta != nil && z.Meta.Leader == n.name {
			return i
		}
	}
	return -1
}

// current reports whether running node i is current with the meta leader
// (a process: its /healthz, which also wants its streams current).
func (c *NATSCluster) current(i int) bool {
	n := c.nodes[i]
	if n.srv != nil {
		return n.srv.JetStreamIsCurrent()
	}
	return c.monitor(i, "/healthz", nil)
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
		for i, n := range c.nodes {
			if n.running() && !c.current(i) {
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
