// Package testenv finds the real Postgres, RabbitMQ and NATS JetStream that
// tests run against, and gives each test its own isolated corner of them.
//
// Services are found, in order: from RELAY_TEST_DATABASE_URL,
// RELAY_TEST_AMQP_URL and RELAY_TEST_NATS_URL; on the standard local ports;
// in containers started by testcontainers-go when a Docker engine answers.
// When none works the test is skipped with a one-line reason, except with
// CI=true, where it fails: CI must never pass by skipping.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/wait"
)

type service struct {
	name    string // for messages
	env     string // override variable
	local   string // URL on the standard local port
	image   string
	port    string // container port, "5432/tcp"
	cmd     []string
	envs    map[string]string
	waitLog string
	scheme  func(hostPort string) string

	once sync.Once
	url  string
	err  error
}

var (
	postgres = &service{
		name: "Postgres", env: "RELAY_TEST_DATABASE_URL",
		local: "postgres://root@127.0.0.1:5432/test?sslmode=disable",
		image: "postgres:15-alpine", port: "5432/tcp",
		envs:    map[string]string{"POSTGRES_HOST_AUTH_METHOD": "trust", "POSTGRES_USER": "root", "POSTGRES_DB": "test"},
		waitLog: "database system is ready to accept connections",
		scheme:  func(hp string) string { return "postgres://root@" + hp + "/test?sslmode=disable" },
	}
	rabbit = &service{
		name: "RabbitMQ", env: "RELAY_TEST_AMQP_URL",
		local: "amqp://guest:guest@127.0.0.1:5672/",
		image: "rabbitmq:3.10-management-alpine", port: "5672/tcp",
		waitLog: "Server startup complete",
		scheme:  func(hp string) string { return "amqp://guest:guest@" + hp + "/" },
	}
	nats = &service{
		name: "NATS", env: "RELAY_TEST_NATS_URL",
		local: "nats://127.0.0.1:4222",
		image: "nats:2.9-alpine", port: "4222/tcp", cmd: []string{"-js"},
		waitLog: "Server is ready",
		scheme:  func(hp string) string { return "nats://" + hp },
	}
)

// DatabaseURL returns the Postgres URL tests use.
func DatabaseURL(t testing.TB) string { return resolve(t, postgres) }

// AMQPURL returns the RabbitMQ URL tests use.
func AMQPURL(t testing.TB) string { return resolve(t, rabbit) }

// NATSURL returns the NATS URL tests use.
func NATSURL(t testing.TB) string { return resolve(t, nats) }

func resolve(t testing.TB, s *service) string {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: skipped in -short mode", s.name)
	}
	s.once.Do(func() { s.url, s.err = s.find() })
	if s.err != nil {
		skipOrFail(t, s.name+" unavailable", s.err)
	}
	return s.url
}

// skipOrFail skips a test that cannot have what it needs, saying what, or
// fails it with CI=true, where everything a test needs must be there.
func skipOrFail(t testing.TB, what string, err error) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true, not skipping): %v", what, err)
	}
	t.Skipf("%s: %v", what, err)
}

func (s *service) find() (string, error) {
	if u := os.Getenv(s.env); u != "" {
		return u, nil
	}
	if reachable(s.local) {
		return s.local, nil
	}
	u, err := s.container()
	if err != nil {
		return "", fmt.Errorf("set %s, run it on its standard port, or start Docker for testcontainers (%v)", s.env, err)
	}
	return u, nil
}

func reachable(rawURL string) bool {
	u, err := url.Parse(rawURL)
	if err != nil {
		return false
	}
	c, err := net.DialTimeout("tcp", u.Host, time.Second)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// container starts the service with testcontainers-go. The container lives
// for the test process; testcontainers' reaper removes it afterwards.
func (s *service) container() (u string, err error) {
	defer func() {
		// testcontainers panics in some Docker-less setups; report, not crash.
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	provider, err := testcontainers.ProviderDefault.GetProvider()
	if err != nil {
		return "", err
	}
	if err := provider.Health(ctx); err != nil {
		return "", err
	}
	opts := []testcontainers.ContainerCustomizer{
		testcontainers.WithExposedPorts(s.port),
		testcontainers.WithEnv(s.envs),
		testcontainers.WithWaitStrategy(wait.ForLog(s.waitLog).WithStartupTimeout(2 * time.Minute)),
	}
	if len(s.cmd) > 0 {
		opts = append(opts, testcontainers.WithCmd(s.cmd...))
	}
	c, err := testcontainers.Run(ctx, s.image, opts...)
	if err != nil {
		return "", err
	}
	ep, err := c.PortEndpoint(ctx, s.port, "")
	if err != nil {
		return "", err
	}
	return s.scheme(ep), nil
}

// Name returns a short unique lower-case name with the given prefix, for a
// schema, stream, exchange or queue that belongs to one test.
func Name(prefix string) string {
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return strings.ToLower(prefix) + "_" + hex.EncodeToString(b[:])
}

// Eventually polls cond every 10ms until it returns true or timeout passes,
// then fails the test with msg. It is the tests' only way to wait for
// asynchronous work: no bare sleeps.
func Eventually(t testing.TB, timeout time.Duration, cond func() bool, msg string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v: "+msg, append([]any{timeout}, args...)...)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
