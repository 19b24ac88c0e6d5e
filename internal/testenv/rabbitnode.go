package testenv

import (
	"context"
	"fmt"
	neturl "net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RabbitNode is a RabbitMQ node of the test's own, for faults that cannot be
// put on the shared broker: a resource alarm blocks every publisher on the
// node, and other tests' too.
type RabbitNode struct {
	URL  string // amqp://guest:guest@127.0.0.1:PORT/
	Name string // the Erlang node name (relaytest_…@localhost), for rabbitmqctl
	t    testing.TB
	run  func(ctx context.Context, name string, args ...string) *exec.Cmd
	dir  string

	cmd    *exec.Cmd
	exited chan struct{} // closed when rabbitmq-server has exited
}

// rabbitDir holds Debian's RabbitMQ scripts (package rabbitmq-server).
const rabbitDir = "/usr/lib/rabbitmq/bin"

// NewRabbitNode starts a RabbitMQ node on a free port, from the machine's
// RabbitMQ installation, with its data in a directory of its own; it is
// stopped and the directory removed when the test ends. It takes about ten
// seconds. The node runs as the rabbitmq user (its Erlang cookie lets
// rabbitmqctl reach it), so the test must run as root or as that user.
// Without such an installation the test is skipped, except with CI=true,
// where it fails.
func NewRabbitNode(t testing.TB) *RabbitNode {
	t.Helper()
	run := rabbitRunnerOrSkip(t)
	holdOwnRabbit(t)
	n := startRabbitNode(t, run, false)
	if err := n.listening(); err != nil {
		t.Fatal(err)
	}
	return n
}

// ownRabbit lets one test of a process at a time run RabbitMQ servers of its
// own: a starting node takes a core for seconds, and the alarm tests assert
// how far JetStream gets meanwhile.
var ownRabbit sync.Mutex

// holdOwnRabbit holds ownRabbit until the test's servers are gone (cleanups
// run last-registered first).
func holdOwnRabbit(t testing.TB) {
	ownRabbit.Lock()
	t.Cleanup(ownRabbit.Unlock)
}

// rabbitRunnerOrSkip is rabbitRunner, skipping the test (failing it with
// CI=true) where it cannot run a node.
func rabbitRunnerOrSkip(t testing.TB) func(ctx context.Context, name string, args ...string) *exec.Cmd {
	t.Helper()
	if testing.Short() {
		t.Skip("needs a RabbitMQ node of its own: skipped in -short mode")
	}
	run, err := rabbitRunner()
	if err != nil {
		skipOrFail(t, "cannot start a RabbitMQ node", err)
	}
	return run
}

// startRabbitNode starts rabbitmq-server for a node of its own and returns
// at once; listening waits for it. At the test's end the node is
// stopped with rabbitmqctl, or with kill (a cluster's: it is thrown away
// whole, and a member stopped cleanly waits for the others).
func startRabbitNode(t testing.TB, run func(ctx context.Context, name string, args ...string) *exec.Cmd, kill bool) *RabbitNode {
	t.Helper()
	port, dist := FreePort(t), FreePort(t)
	name := Name("relaytest") + "@localhost"
	// Not t.TempDir: the node runs as another user, who cannot enter a
	// directory only root may.
	dir, err := os.MkdirTemp("", "relayd-rabbit-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	conf := fmt.Sprintf("listeners.tcp.default = 127.0.0.1:%d\nloopback_users = none\n", port)
	if err := os.WriteFile(filepath.Join(dir, "rabbitmq.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "enabled_plugins"), []byte("[].\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := chownAll(dir); err != nil {
		t.Fatal(err)
	}
	n := &RabbitNode{URL: fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port), Name: name, t: t, run: run, dir: dir,
		exited: make(chan struct{})}
	cmd := run(context.Background(), "rabbitmq-server")
	cmd.Dir = dir
	cmd.Env = append(cmd.Env,
		"RABBITMQ_NODENAME="+name,
		"RABBITMQ_NODE_PORT="+strconv.Itoa(port),
		"RABBITMQ_DIST_PORT="+strconv.Itoa(dist),
		"RABBITMQ_MNESIA_BASE="+filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE="+filepath.Join(dir, "log"),
		"RABBITMQ_PID_FILE="+filepath.Join(dir, "pid"),
		"RABBITMQ_ENABLED_PLUGINS_FILE="+filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_CONFIG_FILE="+filepath.Join(dir, "rabbitmq"),
		// No busy-waiting schedulers: several nodes share two cores with
		// the rest of the suite.
		"RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=+sbwt none +sbwtdcpu none +sbwtdio none",
	)
	out, err := os.Create(filepath.Join(dir, "server.out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		t.Fatalf("start rabbitmq-server: %v", err)
	}
	n.cmd = cmd
	go func() { cmd.Wait(); out.Close(); close(n.exited) }() //nolint:errcheck // the exit is reported below
	t.Cleanup(func() {
		if n.gone() {
			return
		}
		if kill {
			n.killWithin(0)
			return
		}
		if err := n.ctl(30*time.Second, "stop").Run(); err != nil {
			t.Logf("rabbitmqctl stop: %v", err)
		}
		n.killWithin(30 * time.Second)
	})
	return n
}

// listening waits until the node takes AMQP connections.
func (n *RabbitNode) listening() error {
	deadline := time.Now().Add(90 * time.Second)
	for !reachable(n.URL) {
		select {
		case <-n.exited:
			return fmt.Errorf("rabbitmq-server %s exited at start:\n%s", n.Name, n.serverOut())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("RabbitMQ node %s did not listen within 90s", n.Name)
		}
	}
	return nil
}

// Kill ends the node at once (SIGKILL, its whole process group): its
// connections are reset, its peers see it down.
func (n *RabbitNode) Kill() {
	n.t.Helper()
	n.killWithin(0)
}

// killWithin waits up to d for the node to exit by itself, then kills it,
// and waits for that.
func (n *RabbitNode) killWithin(d time.Duration) {
	select {
	case <-n.exited:
		return
	case <-time.After(d):
	}
	syscall.Kill(-n.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck // it may be gone already
	<-n.exited
}

// gone reports whether the node's server has exited.
func (n *RabbitNode) gone() bool {
	select {
	case <-n.exited:
		return true
	default:
		return false
	}
}

// serverOut is the end of what the node's server wrote.
func (n *RabbitNode) serverOut() string {
	log, _ := os.ReadFile(filepath.Join(n.dir, "server.out"))
	return tail(string(log), 2000)
}

// MemoryAlarm raises (on) or clears the node's memory alarm by moving its
// high watermark: while raised, RabbitMQ blocks every publishing connection
// (connection.blocked) and stops reading from it.
func (n *RabbitNode) MemoryAlarm(on bool) {
	n.t.Helper()
	if on {
		n.Ctl("set_vm_memory_high_watermark", "absolute", "1")
	} else {
		n.Ctl("set_vm_memory_high_watermark", "0.4")
	}
}

// Ctl runs rabbitmqctl with args against the node, failing the test when it
// fails: add_user, set_permissions, set_policy.
func (n *RabbitNode) Ctl(args ...string) {
	n.t.Helper()
	if out, err := n.ctl(30*time.Second, args...).CombinedOutput(); err != nil {
		n.t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// ctl is rabbitmqctl against node n; a RabbitNode without a Name is the
// shared broker (rabbitmqctl's default node).
func (n *RabbitNode) ctl(timeout time.Duration, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	n.t.Cleanup(cancel)
	if n.Name != "" {
		args = append([]string{"-n", n.Name}, args...)
	}
	return n.run(ctx, "rabbitmqctl", args...)
}

// rabbitRunner returns how to run Debian's RabbitMQ scripts as the rabbitmq
// user, with its home (and Erlang cookie).
func rabbitRunner() (func(context.Context, string, ...string) *exec.Cmd, error) {
	if _, err := os.Stat(filepath.Join(rabbitDir, "rabbitmq-server")); err != nil {
		return nil, fmt.Errorf("no RabbitMQ installation: %w", err)
	}
	u, err := user.Lookup("rabbitmq")
	if err != nil {
		return nil, err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	me := os.Getuid()
	if me != 0 && me != uid {
		return nil, fmt.Errorf("runs as root or as the rabbitmq user, not uid %d", me)
	}
	return func(ctx context.Context, name string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, filepath.Join(rabbitDir, name), args...)
		cmd.Env = append(os.Environ(), "HOME="+u.HomeDir)
		cmd.SysProcAttr = &syscall.SysProcAttr{}
		if me == 0 {
			cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		}
		return cmd
	}, nil
}

func chownAll(dir string) error {
	u, err := user.Lookup("rabbitmq")
	if err != nil {
		return err
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if os.Getuid() != 0 {
		return nil // running as rabbitmq already
	}
	return filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		return os.Chown(p, uid, gid)
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// RabbitUser adds a user of the test's own to the shared RabbitMQ, with
// every permission on the default vhost, and deletes it when the test ends;
// it returns its name and the AMQP URL that logs in as it. Ctl changes its
// permissions. Without rabbitmqctl (a broker in a container) the test is
// skipped, except with CI=true, where it fails.
func RabbitUser(t testing.TB) (name, url string) {
	t.Helper()
	run, err := rabbitRunner()
	if err != nil {
		skipOrFail(t, "cannot run rabbitmqctl against the shared RabbitMQ", err)
	}
	name, password := Name("relay"), Name("pw")
	u := &RabbitNode{t: t, run: run}
	u.Ctl("add_user", name, password)
	t.Cleanup(func() { u.Ctl("delete_user", name) })
	u.Ctl("set_permissions", "-p", "/", name, ".*", ".*", ".*")
	u2, err := neturl.Parse(AMQPURL(t))
	if err != nil {
		t.Fatal(err)
	}
	u2.User = neturl.UserPassword(name, password)
	return name, u2.String()
}

// RabbitCtl runs rabbitmqctl with args against the shared RabbitMQ, failing
// the test when it fails: for the user RabbitUser made, and nothing else.
func RabbitCtl(t testing.TB, args ...string) {
	t.Helper()
	run, err := rabbitRunner()
	if err != nil {
		skipOrFail(t, "cannot run rabbitmqctl against the shared RabbitMQ", err)
	}
	(&RabbitNode{t: t, run: run}).Ctl(args...)
}
