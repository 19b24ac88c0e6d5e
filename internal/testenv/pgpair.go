package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// PGServer is a Postgres server of the test's own, started from the
// machine's installation, for faults that cannot be put on the shared
// server: stopping it, promoting its standby.
type PGServer struct {
	Port   int
	Dir    string // the data directory
	t      testing.TB
	run    func(name string, args ...string) *exec.Cmd
	log    string // the server's output
	cmd    *exec.Cmd
	exited chan struct{}
}

// pgUser is the superuser the servers are initialised with (trust auth on
// loopback only).
const pgUser = "relay"

// NewPGPair starts a primary and a synchronous standby streaming from it
// (synchronous_standby_names='*' on the primary only, so that a promoted
// standby does not wait for a standby of its own), each on a free loopback
// port with its data in a directory of its own. Both are stopped and the
// directories removed when the test ends. Postgres refuses to run as root:
// as root, the servers run as the postgres user. Without an installation the
// test is skipped, except with CI=true, where it fails.
func NewPGPair(t testing.TB) (primary, standby *PGServer) {
	t.Helper()
	return newPGPair(t, true)
}

// NewPGPairAsync is NewPGPair with the standby asynchronous (the primary's
// commits do not wait for it), streaming through the address via returns
// for the primary's (a proxy of the test's, to cut the replication off).
func NewPGPairAsync(t testing.TB, via func(primaryAddr string) string) (primary, standby *PGServer) {
	t.Helper()
	return newPGPair(t, false, via)
}

func newPGPair(t testing.TB, synchronous bool, via ...func(string) string) (primary, standby *PGServer) {
	t.Helper()
	if testing.Short() {
		t.Skip("needs Postgres servers of its own: skipped in -short mode")
	}
	run, err := pgRunner()
	if err != nil {
		skipOrFail(t, "cannot start Postgres servers", err)
	}
	// Not t.TempDir: the servers may run as another user, who cannot enter
	// a directory only root may.
	root, err := os.MkdirTemp("", "relayd-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := chownTo(root, run); err != nil {
		t.Fatal(err)
	}
	primary = &PGServer{Port: FreePort(t), Dir: filepath.Join(root, "primary"), t: t, run: run}
	standby = &PGServer{Port: FreePort(t), Dir: filepath.Join(root, "standby"), t: t, run: run}
	primary.ctl(2*time.Minute, "initdb", "-D", primary.Dir, "-U", pgUser, "--auth=trust", "-E", "UTF8", "--no-sync")
	conf := "listen_addresses = '127.0.0.1'\nwal_level = replica\nmax_wal_senders = 4\nhot_standby = on\n" +
		"fsync = off\nshared_buffers = 32MB\nmax_connections = 100\n"
	f, err := os.OpenFile(filepath.Join(primary.Dir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		t.Fatalf("configure primary: %v", err)
	}
	if synchronous {
		primary.start("-c", "synchronous_standby_names=*")
	} else {
		primary.start()
	}
	upstream := "127.0.0.1:" + strconv.Itoa(primary.Port)
	if len(via) > 0 {
		upstream = via[0](upstream)
	}
	host, port, err := net.SplitHostPort(upstream)
	if err != nil {
		t.Fatalf("standby's upstream %q: %v", upstream, err)
	}
	standby.ctl(2*time.Minute, "pg_basebackup", "-h", host, "-p", port, "-U", pgUser,
		"-D", standby.Dir, "-R", "-X", "stream", "--no-sync", "-c", "fast")
	standby.start()
	primary.waitStandby(synchronous)
	return primary, standby
}

// URL is the server's URL, for the postgres database.
func (s *PGServer) URL() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/postgres?sslmode=disable", pgUser, s.Port)
}

// MultiHostURL is one URL naming every server, that connects to whichever of
// them takes writes (target_session_attrs=read-write).
func MultiHostURL(servers ...*PGServer) string {
	hosts := make([]string, len(servers))
	for i, s := range servers {
		hosts[i] = "127.0.0.1:" + strconv.Itoa(s.Port)
	}
	return fmt.Sprintf("postgres://%s@%s/postgres?sslmode=disable&target_session_attrs=read-write", pgUser, strings.Join(hosts, ","))
}

// Stop stops the server with pg_ctl's mode: "immediate" is a crash (no
// checkpoint, every session cut at once).
func (s *PGServer) Stop(mode string) {
	s.t.Helper()
	// -W: the test waits for its own child, not for pg_ctl's poll of the
	// pid file.
	s.ctl(time.Minute, "pg_ctl", "stop", "-D", s.Dir, "-m", mode, "-W")
	select {
	case <-s.exited:
		return
	case <-time.After(stopWait):
	}
	// Seen with a replication connection through a proxy cut off by a
	// toxic: one child outlived the immediate stop, and the postmaster
	// waited for it. Kill them, as a crash would.
	s.t.Logf("postgres on port %d still running %v after pg_ctl stop -m %s: SIGKILL to it and its children %v",
		s.Port, stopWait, mode, s.killChildren())
	s.cmd.Process.Kill() //nolint:errcheck // it may have exited meanwhile
	<-s.exited
}

// stopWait is how long Stop waits for the server to exit before it kills it.
const stopWait = 5 * time.Second

// killChildren SIGKILLs the postmaster's children and returns their pids.
func (s *PGServer) killChildren() []int {
	var pids []int
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so read past the last ')'.
		i := strings.LastIndexByte(string(b), ')')
		fields := strings.Fields(string(b[i+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(s.cmd.Process.Pid) {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(filepath.Dir(f))); err == nil {
			syscall.Kill(pid, syscall.SIGKILL) //nolint:errcheck // it may have exited meanwhile
			pids = append(pids, pid)
		}
	}
	return pids
}

// Promote promotes a standby and waits until it takes writes.
func (s *PGServer) Promote() {
	s.t.Helper()
	s.ctl(time.Minute, "pg_ctl", "promote", "-D", s.Dir, "-w")
}

// start runs postgres in the foreground, as a child that dies with the
// test binary, and waits until it accepts connections.
func (s *PGServer) start(opts ...string) {
	t := s.t
	t.Helper()
	if err := os.Chmod(s.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s.log = filepath.Join(filepath.Dir(s.Dir), filepath.Base(s.Dir)+".log")
	out, err := os.Create(s.log)
	if err != nil {
		t.Fatal(err)
	}
	args := append([]string{"-D", s.Dir, "-p", strconv.Itoa(s.Port), "-k", filepath.Dir(s.Dir)}, opts...)
	cmd := s.run("postgres", args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	if err := cmd.Start(); err != nil {
		t.Fatalf("start postgres: %v", err)
	}
	s.cmd, s.exited = cmd, make(chan struct{})
	go func() { cmd.Wait(); out.Close(); close(s.exited) }() //nolint:errcheck // the exit is seen by the wait below
	t.Cleanup(func() {
		select {
		case <-s.exited:
			return
		default:
		}
		cmd.Process.Signal(syscall.SIGQUIT) //nolint:errcheck // an immediate shutdown
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill() //nolint:errcheck // last resort
			<-s.exited
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		conn, err := pgx.Connect(ctx, s.URL())
		cancel()
		if err == nil {
			conn.Close(context.Background())
			return
		}
		select {
		case <-s.exited:
			log, _ := os.ReadFile(s.log)
			t.Fatalf("postgres on port %d exited at start:\n%s", s.Port, tail(string(log), 2000))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres on port %d did not accept connections within 60s: %v", s.Port, err)
		}
	}
}

// waitStandby waits until the primary has a standby streaming (in sync, if
// synchronous: every commit from then on waits for the standby's flush).
func (s *PGServer) waitStandby(synchronous bool) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL())
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for {
		var n int
		err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND (sync_state = 'sync' OR NOT $1)`, synchronous).Scan(&n)
		if err != nil {
			s.t.Fatalf("wait for the synchronous standby: %v", err)
		}
		if n > 0 {
			return
		}
		select {
		case <-ctx.Done():
			s.t.Fatal("no standby streaming within 60s")
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// ctl runs one of the installation's programs to completion, killing it
// after timeout.
func (s *PGServer) ctl(timeout time.Duration, name string, args ...string) {
	s.t.Helper()
	cmd := s.run(name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Start()
	if err == nil {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err = <-done:
		case <-time.After(timeout):
			cmd.Process.Kill() //nolint:errcheck // reported below
			err = fmt.Errorf("killed after %v: %w", timeout, <-done)
		}
	}
	if err != nil {
		s.t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, tail(out.String(), 2000))
	}
}

// pgRunner finds the newest Postgres installation's programs and returns
// how to run them: as the postgres user when the test runs as root.
func pgRunner() (func(string, ...string) *exec.Cmd, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	slices.SortFunc(dirs, func(a, b string) int { return pgMajor(b) - pgMajor(a) })
	var bin string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "pg_basebackup")); err == nil {
			bin = d
			break
		}
	}
	if bin == "" {
		return nil, fmt.Errorf("no Postgres installation with initdb and pg_basebackup in /usr/lib/postgresql/*/bin")
	}
	cred, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	return func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		cmd.Dir = os.TempDir() // a directory the postgres user may enter
		cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		return cmd
	}, nil
}

// postgresCredential is the postgres user's, for a server that will not
// run as root; nil when the test does not run as root.
func postgresCredential() (*syscall.Credential, error) {
	if os.Getuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and no postgres user to run the servers as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func pgMajor(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

// chownTo gives dir to the user run runs as.
func chownTo(dir string, run func(string, ...string) *exec.Cmd) error {
	c := run("x").SysProcAttr.Credential
	if c == nil {
		return nil
	}
	return os.Chown(dir, int(c.Uid), int(c.Gid))
}
