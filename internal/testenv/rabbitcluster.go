package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// RabbitCluster is a RabbitMQ cluster of the test's own, for faults a
// single broker cannot show: a node lost under a client, a quorum queue
// electing another leader.
type RabbitCluster struct {
	Nodes []*RabbitNode
	// Started is how long the nodes took to start and join.
	Started time.Duration
}

// NewRabbitCluster starts n RabbitMQ nodes as NewRabbitNode does (at once,
// each on ports of its own, the one Erlang cookie of the rabbitmq user) and
// joins the others to the first with rabbitmqctl join_cluster. The nodes
// are killed and their directories removed when the test ends. It skips
// where NewRabbitNode skips.
func NewRabbitCluster(t testing.TB, n int) *RabbitCluster {
	t.Helper()
	run := rabbitRunnerOrSkip(t)
	holdOwnRabbit(t)
	begin := time.Now()
	c := &RabbitCluster{}
	for range n {
		c.Nodes = append(c.Nodes, startRabbitNode(t, run, true))
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, node := range c.Nodes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = node.listening() }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// One at a time: each join rewrites the cluster's membership on every
	// member.
	for _, node := range c.Nodes[1:] {
		for _, args := range [][]string{{"stop_app"}, {"join_cluster", c.Nodes[0].Name}, {"start_app"}} {
			if out, err := node.ctl(60*time.Second, args...).CombinedOutput(); err != nil {
				t.Fatalf("rabbitmqctl -n %s %s: %v\n%s\nserver:\n%s", node.Name, strings.Join(args, " "), err, out, node.serverOut())
			}
		}
	}
	c.Started = time.Since(begin)
	return c
}

// URLs is the URLs of nodes, comma-separated in that order: a
// RELAY_AMQP_URL.
func (c *RabbitCluster) URLs(nodes ...*RabbitNode) string {
	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.URL
	}
	return strings.Join(urls, ",")
}

// Report is what node says of the cluster and its queues (rabbitmqctl
// cluster_status and list_queues) and the end of its log: for the log of a
// failed test.
func (n *RabbitNode) Report() string {
	var b strings.Builder
	for _, args := range [][]string{
		{"cluster_status"},
		{"list_queues", "name", "type", "leader", "members", "online", "messages", "consumers"},
	} {
		out, err := n.ctl(60*time.Second, args...).CombinedOutput()
		fmt.Fprintf(&b, "rabbitmqctl -n %s %s (%v):\n%s\n", n.Name, strings.Join(args, " "), err, out)
	}
	logs, _ := filepath.Glob(filepath.Join(n.dir, "log", "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		fmt.Fprintf(&b, "%s:\n%s\n", filepath.Base(l), tail(string(data), 6000))
	}
	return b.String()
}
