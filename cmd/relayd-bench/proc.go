package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/relayd/relayd/internal/backoff"
)

// proc is a relayd subprocess.
type proc struct {
	cmd    *exec.Cmd
	out    *syncBuffer // stderr: the logs
	stdout *syncBuffer
	done   chan struct{}
	err    error
	hwmKB  int64 // VmHWM, last sampled
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start starts relayd with args and env; it does not wait for anything.
func (b *bench) start(env []string, args ...string) (*proc, error) {
	p := &proc{out: &syncBuffer{}, stdout: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(b.relaydBin, args...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.out
	dieWithBench(p.cmd)
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start relayd: %w", err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitStarted waits until `relayd run` says it is relaying.
func (p *proc) waitStarted(ctx context.Context) error {
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(p.out.String(), "relay started") {
		if p.exited() {
			return fmt.Errorf("relayd exited at start: %v\n%s", p.err, p.out.String())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("relayd did not start within 30s:\n%s", p.out.String())
		}
		if !backoff.Sleep(ctx, 5*time.Millisecond) {
			return ctx.Err()
		}
	}
	return nil
}

// sampleHWM reads the process's peak resident set (VmHWM) while it runs.
func (p *proc) sampleHWM() {
	if p.exited() {
		return
	}
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err == nil && kb > p.hwmKB {
				p.hwmKB = kb
			}
		}
	}
}

// usage is what a finished process cost.
type usage struct {
	CPU     time.Duration // user + system
	PeakRSS int64         // bytes: VmHWM sampled before exit, else ru_maxrss
}

// stop samples VmHWM, sends SIGTERM and waits for a clean exit, and returns
// the process's CPU time and peak RSS.
func (p *proc) stop() (usage, error) {
	p.sampleHWM()
	if !p.exited() {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-p.done:
	case <-time.After(45 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
		return usage{}, fmt.Errorf("relayd did not exit within 45s of SIGTERM:\n%s", tail(p.out.String(), 2000))
	}
	var u usage
	if st := p.cmd.ProcessState; st != nil {
		u.CPU = st.UserTime() + st.SystemTime()
		if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
			u.PeakRSS = ru.Maxrss * 1024 // kilobytes on Linux
		}
	}
	if p.hwmKB > 0 {
		u.PeakRSS = p.hwmKB * 1024
	}
	if p.err != nil {
		return u, fmt.Errorf("relayd exited with %v:\n%s", p.err, tail(p.out.String(), 2000))
	}
	return u, nil
}

// kill ends a process that is no longer measured (cleanup after an error).
func (p *proc) kill() {
	if !p.exited() {
		p.cmd.Process.Kill()
	}
	<-p.done
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// oneShot is a relayd command run to its exit: its stdout, its log, and
// what it took.
type oneShot struct {
	stdout, log string
	elapsed     time.Duration // process start to exit
	u           usage
	split       *CPUSplit
}

// runToExit runs relayd with args in the corner's environment, without an
// HTTP server unless -relayd-env asks for one (RELAY_PPROF with a
// RELAY_METRICS_ADDR, to profile it: the last of duplicate variables wins),
// and measures it over n messages.
func (b *bench) runToExit(ctx context.Context, cr *corner, n int, args ...string) (oneShot, error) {
	var r oneShot
	env := cr.relaydEnv("")
	for i, e := range env {
		if strings.HasPrefix(e, "RELAY_METRICS_ADDR=") {
			env[i] = "RELAY_METRICS_ADDR="
			break
		}
	}
	snap := takeCPUSnap()
	start := time.Now()
	p, err := b.start(env, args...)
	if err != nil {
		return r, err
	}
	defer p.kill()
	for !p.exited() {
		p.sampleHWM()
		select {
		case <-ctx.Done():
			return r, ctx.Err()
		case <-p.done:
		case <-time.After(100 * time.Millisecond):
		}
	}
	r.elapsed = time.Since(start)
	r.split = cpuSplit(snap, takeCPUSnap(), n)
	if r.u, err = p.stop(); err != nil {
		return r, err
	}
	if r.split != nil {
		r.split.Relayd = per10k(r.u.CPU, n) // the process is gone from /proc by now
	}
	r.stdout, r.log = p.stdout.String(), p.out.String()
	return r, nil
}
