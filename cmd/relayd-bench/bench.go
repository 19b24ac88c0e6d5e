package main

import (
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
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
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
