package testenv

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// PgBouncer runs a PgBouncer of the test's own in front of the test
// database, in pool mode mode ("session", "transaction"), ignoring the
// startup parameters ignore (its ignore_startup_parameters), and returns a
// URL of the test database through it. It stops when the test ends.
// Without a pgbouncer on the PATH or in /usr/sbin the test is skipped,
// except with CI=true, where it fails.
func PgBouncer(t testing.TB, mode string, ignore ...string) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin, err = exec.LookPath("/usr/sbin/pgbouncer")
	}
	if err != nil {
		skipOrFail(t, "no pgbouncer (Debian's pgbouncer package)", err)
	}
	cred, err := postgresCredential() // it will not run as root
	if err != nil {
		skipOrFail(t, "cannot run pgbouncer", err)
	}
	db, err := url.Parse(DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "relayd-pgbouncer-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	port, user := FreePort(t), db.User.Username()
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
ignore_startup_parameters = %s
`, db.Hostname(), db.Port(), port, filepath.Join(dir, "users.txt"), mode, strings.Join(ignore, ", "))
	for name, text := range map[string]string{"pgbouncer.ini": ini, "users.txt": fmt.Sprintf("%q \"\"\n", user)} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var out SyncBuffer
	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, &out, &out
	dieWithTest(cmd)
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = cred
	if err := cmd.Start(); err != nil {
		t.Fatalf("start pgbouncer: %v", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()          //nolint:errcheck // its output says why
	t.Cleanup(func() { cmd.Process.Kill(); <-exited }) //nolint:errcheck // it may be gone
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	Eventually(t, 10*time.Second, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, "pgbouncer never listened on %s:\n%s", addr, &out)
	through := *db
	through.Host = addr
	return through.String()
}
