package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// RabbitNode is a RabbitMQ node of the test's own, for faults that cannot be
// put on the shared broker: a resource alarm blocks every publisher on the
// node, and other tests' too.
type RabbitNode struct {
	URL  string // amqp://guest:guest@127.0.0.1:PORT/
	name string // the Erlang node name, for rabbitmqctl
	t    testing.TB
	run  func(ctx context.Context, name string, args ...string) *exec.Cmd
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
	if testing.Short() {
		t.Skip("needs a RabbitMQ node of its own: skipped in -short mode")
	}
	run, err := rabbitRunner()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("cannot start a RabbitMQ node (CI=true, not skipping): %v", err)
		}
		t.Skipf("cannot start a RabbitMQ node: %v", err)
	}
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
	n := &RabbitNode{URL: fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", port), name: name, t: t, run: run}
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
	exited := make(chan struct{})
	go func() { cmd.Wait(); out.Close(); close(exited) }() //nolint:errcheck // the exit is reported below
	t.Cleanup(func() {
		stop := n.ctl(30*time.Second, "stop")
		if err := stop.Run(); err != nil {
			t.Logf("rabbitmqctl stop: %v", err)
		}
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck // last resort
			<-exited
		}
	})
	deadline := time.Now().Add(90 * time.Second)
	for !reachable(n.URL) {
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "server.out"))
			t.Fatalf("rabbitmq-server exited at start:\n%s", tail(string(log), 2000))
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("RabbitMQ node did not listen within 90s")
		}
	}
	return n
}

// MemoryAlarm raises (on) or clears the node's memory alarm by moving its
// high watermark: while raised, RabbitMQ blocks every publishing connection
// (connection.blocked) and stops reading from it.
func (n *RabbitNode) MemoryAlarm(on bool) {
	n.t.Helper()
	args := []string{"set_vm_memory_high_watermark", "0.4"}
	if on {
		args = []string{"set_vm_memory_high_watermark", "absolute", "1"}
	}
	if out, err := n.ctl(30*time.Second, args...).CombinedOutput(); err != nil {
		n.t.Fatalf("rabbitmqctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (n *RabbitNode) ctl(timeout time.Duration, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	n.t.Cleanup(cancel)
	return n.run(ctx, "rabbitmqctl", append([]string{"-n", n.name}, args...)...)
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

// FreePort returns a TCP port on loopback that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
