package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/relayd/relayd/internal/backoff"
	"github.com/relayd/relayd/schema"
)

// bench holds the connections and the relayd binary shared by every
// measurement.
type bench struct {
	o             options
	pool          *pgxpool.Pool
	nc            *nats.Conn
	js            jetstream.JetStream
	amqpConn      *amqp.Connection
	relaydBin     string
	relaydVersion string
	tmpDir        string
	payload       []byte
}

func newBench(ctx context.Context, o options) (_ *bench, err error) {
	b := &bench{o: o}
	defer func() {
		if err != nil {
			b.close()
		}
	}()
	b.payload = make([]byte, o.Payload)
	rand.Read(b.payload)

	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	pc, err := pgxpool.ParseConfig(o.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("database URL: %w", err)
	}
	pc.MaxConns = 64
	pc.ConnConfig.RuntimeParams["application_name"] = "relayd-bench"
	if b.pool, err = pgxpool.NewWithConfig(cctx, pc); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := b.pool.Ping(cctx); err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if b.nc, err = nats.Connect(o.NATSURL, nats.Name("relayd-bench"), nats.MaxReconnects(-1)); err != nil {
		return nil, fmt.Errorf("nats: %w", err)
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		return nil, err
	}
	// amqp091-go's own transport (the setup and the idle-latency probe).
	if b.amqpConn, err = amqp.Dial(o.AMQPURL); err != nil {
		return nil, fmt.Errorf("rabbitmq: %w", err)
	}
	if b.tmpDir, err = os.MkdirTemp("", "relayd-bench-"); err != nil {
		return nil, err
	}
	b.relaydBin = o.Relayd
	if b.relaydBin == "" {
		if b.relaydBin, err = b.buildRelayd(ctx); err != nil {
			return nil, err
		}
	}
	out, err := exec.CommandContext(ctx, b.relaydBin, "version").Output()
	if err != nil {
		return nil, fmt.Errorf("%s version: %w", b.relaydBin, err)
	}
	b.relaydVersion = strings.TrimSpace(string(out))
	b.logf("benchmarking %s (%s)", b.relaydVersion, b.relaydBin)
	return b, nil
}

func (b *bench) close() {
	if b.amqpConn != nil {
		b.amqpConn.Close()
	}
	if b.nc != nil {
		b.nc.Close()
	}
	if b.pool != nil {
		b.pool.Close()
	}
	if b.tmpDir != "" {
		os.RemoveAll(b.tmpDir)
	}
}

func (b *bench) logf(format string, args ...any) {
	if b.o.Log != nil {
		fmt.Fprintf(b.o.Log, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
}

// buildRelayd builds ./cmd/relayd of this module with `make build`'s
// ldflags. (Not -trimpath: that would recompile every package instead of
// reusing the build cache the tests and `go build` fill; it changes nothing
// the benchmark measures.)
func (b *bench) buildRelayd(ctx context.Context) (string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	if root == "." || root == "" {
		return "", errors.New("not inside the relayd module: run from the repository, or pass -relayd")
	}
	bin := filepath.Join(b.tmpDir, "relayd")
	b.logf("building relayd %s", b.o.Version)
	cmd := exec.CommandContext(ctx, "go", "build", "-ldflags", "-s -w -X main.version="+b.o.Version, "-o", bin, "./cmd/relayd")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stderr, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("go build ./cmd/relayd: %w\n%s", err, stderr.String())
	}
	return bin, nil
}

func gitDescribe() string {
	out, err := exec.Command("git", "describe", "--tags", "--always", "--dirty").Output()
	if v := strings.TrimSpace(string(out)); err == nil && v != "" {
		return v
	}
	return "dev"
}

// newName returns a unique lower-case name for one measurement's schema,
// stream, exchange and queue.
func newName() string {
	var r [5]byte
	rand.Read(r[:])
	return "bench_" + hex.EncodeToString(r[:])
}

// topic is the outbox topic (and AMQP routing key) every benchmark message
// uses; the subject is the corner's prefix + topic.
const topic = "bench.msg"

// corner is one measurement's private part of the three services. Every
// part is optional; close removes what was made.
type corner struct {
	b        *bench
	name     string
	table    schema.Table // zero: none
	stream   string       // "": none
	prefix   string
	exchange string // "": none
	queue    string
}

type cornerSpec struct{ table, stream, amqp bool }

func (b *bench) newCorner(ctx context.Context, spec cornerSpec) (_ *corner, err error) {
	c := &corner{b: b, name: newName()}
	defer func() {
		if err != nil {
			c.close()
		}
	}()
	if spec.table {
		t := schema.Table{Schema: c.name, Name: "outbox"}
		db := stdlib.OpenDBFromPool(b.pool)
		_, err := schema.Up(ctx, db, t, nil)
		db.Close()
		c.table = t // set before checking err: close drops a half-made schema
		if err != nil {
			return nil, fmt.Errorf("migrate %s: %w", t, err)
		}
	}
	if spec.stream {
		c.stream, c.prefix = strings.ToUpper(c.name), c.name+"."
		if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{
			Name: c.stream, Subjects: []string{c.prefix + ">"},
			Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute,
		}); err != nil {
			c.stream = ""
			return nil, fmt.Errorf("create stream: %w", err)
		}
	}
	if spec.amqp {
		ch, err := b.amqpConn.Channel()
		if err != nil {
			return nil, err
		}
		defer ch.Close()
		c.exchange, c.queue = c.name, c.name+"_q"
		if err := ch.ExchangeDeclare(c.exchange, "topic", true, false, false, false, nil); err != nil {
			return nil, err
		}
		if _, err := ch.QueueDeclare(c.queue, true, false, false, false, nil); err != nil {
			return nil, err
		}
		if err := ch.QueueBind(c.queue, "#", c.exchange, false, nil); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *corner) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	b := c.b
	if c.stream != "" {
		if err := b.js.DeleteStream(ctx, c.stream); err != nil {
			b.logf("cleanup: delete stream %s: %v", c.stream, err)
		}
	}
	if c.exchange != "" {
		if ch, err := b.amqpConn.Channel(); err == nil {
			if _, err := ch.QueueDelete(c.queue, false, false, false); err != nil {
				b.logf("cleanup: delete queue %s: %v", c.queue, err)
			} else if err := ch.ExchangeDelete(c.exchange, false, false); err != nil {
				b.logf("cleanup: delete exchange %s: %v", c.exchange, err)
			}
			ch.Close()
		}
	}
	if c.table.Schema != "" {
		if _, err := b.pool.Exec(ctx, `DROP SCHEMA IF EXISTS "`+c.table.Schema+`" CASCADE`); err != nil {
			b.logf("cleanup: drop schema %s: %v", c.table.Schema, err)
		}
	}
}

// fill inserts n rows of the benchmark payload in one statement, then
// ANALYZEs the table and checkpoints, so that the measurement that follows
// pays neither for stale statistics nor for the fill's dirty buffers. With
// keys > 0 the rows carry that many distinct keys taking turns (row i has
// key i mod keys), as many aggregates written at once do; with 0, no key.
func (c *corner) fill(ctx context.Context, n, keys int) error {
	tbl := c.table.Ident()
	if _, err := c.b.pool.Exec(ctx, `INSERT INTO `+tbl+` (topic, key, payload)
		SELECT $1, CASE WHEN $4::int > 0 THEN 'key-' || (i % $4::int) END, $2::bytea FROM generate_series(1, $3) i`,
		topic, c.b.payload, n, keys); err != nil {
		return fmt.Errorf("fill %s: %w", c.table, err)
	}
	if _, err := c.b.pool.Exec(ctx, `ANALYZE `+tbl); err != nil {
		return fmt.Errorf("analyze %s: %w", c.table, err)
	}
	c.b.checkpoint(ctx)
	return nil
}

// fillTraced inserts n rows of the benchmark payload with null keys, as
// fill does, each with a W3C traceparent in its headers: random trace and
// parent ids, flags 01 (sampled) on every sampledEvery-th row and 00 on the
// others, the header a traced producer writes.
func (c *corner) fillTraced(ctx context.Context, n, sampledEvery int) error {
	tbl := c.table.Ident()
	if _, err := c.b.pool.Exec(ctx, `INSERT INTO `+tbl+` (topic, headers, payload)
		SELECT $1, jsonb_build_object('traceparent', '00-'
			|| replace(gen_random_uuid()::text, '-', '') || '-'
			|| left(replace(gen_random_uuid()::text, '-', ''), 16) || '-'
			|| CASE WHEN i % $4::int = 0 THEN '01' ELSE '00' END),
			$2::bytea FROM generate_series(1, $3) i`,
		topic, c.b.payload, n, sampledEvery); err != nil {
		return fmt.Errorf("fill %s: %w", c.table, err)
	}
	if _, err := c.b.pool.Exec(ctx, `ANALYZE `+tbl); err != nil {
		return fmt.Errorf("analyze %s: %w", c.table, err)
	}
	c.b.checkpoint(ctx)
	return nil
}

// checkpoint flushes Postgres's dirty buffers now rather than during the
// next measurement. Best effort: it needs superuser (or pg_checkpoint).
func (b *bench) checkpoint(ctx context.Context) {
	b.pool.Exec(ctx, `CHECKPOINT`) //nolint:errcheck // best effort
}

// queueDepth is the number of ready messages in the corner's queue.
func (c *corner) queueDepth() (int, error) {
	ch, err := c.b.amqpConn.Channel()
	if err != nil {
		return 0, err
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(c.queue, true, false, false, false, nil)
	if err != nil {
		return 0, err
	}
	return q.Messages, nil
}

// streamMsgs is the number of messages in the corner's stream.
func (c *corner) streamMsgs(ctx context.Context) (uint64, error) {
	s, err := c.b.js.Stream(ctx, c.stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// relaydEnv is the environment of a relayd process working on c; relayd's
// own defaults apply to everything not named here.
func (c *corner) relaydEnv(targets string) []string {
	o := c.b.o
	env := []string{
		"PATH=" + os.Getenv("PATH"),
		"RELAY_DATABASE_URL=" + o.DatabaseURL,
		"RELAY_NATS_URL=" + o.NATSURL,
		"RELAY_AMQP_URL=" + o.AMQPURL,
		"RELAY_OUTBOX_TABLE=" + c.table.String(),
		"RELAY_METRICS_ADDR=127.0.0.1:0",
	}
	if targets != "" {
		env = append(env, "RELAY_TARGETS="+targets)
	}
	if c.stream != "" {
		env = append(env, "RELAY_NATS_STREAM="+c.stream, "RELAY_NATS_SUBJECT_PREFIX="+c.prefix)
	}
	if c.exchange != "" {
		env = append(env, "RELAY_AMQP_EXCHANGE="+c.exchange)
	}
	return append(env, o.RelaydEnv...)
}

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

// machine describes where the benchmark ran.
func (b *bench) machine(ctx context.Context) Machine {
	m := Machine{CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb int64
		if _, err := fmt.Sscanf(string(data), "MemTotal: %d kB", &kb); err == nil {
			m.MemoryGiB = float64(kb) / (1 << 20)
		}
	}
	if data, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(data))
	}
	var pg string
	if b.pool.QueryRow(ctx, `SHOW server_version`).Scan(&pg) == nil {
		m.Postgres = pg
	}
	if v, ok := b.amqpConn.Properties["version"].(string); ok {
		m.RabbitMQ = v
	}
	m.NATS = b.nc.ConnectedServerVersion()
	m.LoadStart = loadAvg()
	return m
}

// loadAvg is the 1, 5 and 15 minute load averages.
func loadAvg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
