package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/internal/testenv"
)

func TestProcStat(t *testing.T) {
	// pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt
	// majflt cmajflt utime stime cutime cstime ...
	const rest = " S 1 1 1 0 -1 4194560 100 5 0 0 70 30 900 100 20 0 1 0 12345"
	for _, tc := range []struct {
		line string
		comm string
		want uint64
	}{
		{"4242 (postgres)" + rest, "postgres", 70 + 30 + 900 + 100},
		{"4243 (nats-server)" + rest, "nats-server", 70 + 30},
		{"4244 (a (b) c)" + rest, "a (b) c", 70 + 30},
	} {
		p, ok := procStat(tc.line)
		if !ok || p.comm != tc.comm || p.ticks != tc.want {
			t.Errorf("procStat(%q) = %+v, %v; want comm %q, ticks %d", tc.line, p, ok, tc.comm, tc.want)
		}
	}
	if _, ok := procStat("4245 (short) S 1 2"); ok {
		t.Error("procStat of a truncated line: ok")
	}
}

// A backend's CPU stays counted after its connection closed: the backfill's
// connections end before the bench's second snapshot.
func TestPostgresCPUOfEndedBackendsCounts(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here: the CPU split is Linux-only")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		t.Fatal(err)
	}
	stat := func(pid int) (procCPU, []string) {
		t.Helper()
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			t.Skipf("Postgres's processes are not readable here (%v): not on this machine", err)
		}
		p, ok := procStat(string(data))
		if !ok {
			t.Fatalf("pid %d: cannot parse %q", pid, data)
		}
		if p.comm != "postgres" {
			t.Skipf("pid %d here is %q, not Postgres's: Postgres runs elsewhere (a container?)", pid, p.comm)
		}
		return p, strings.Fields(string(data)[strings.LastIndexByte(string(data), ')')+1:])
	}
	_, f := stat(backend)
	postmaster, err := strconv.Atoi(f[1]) // ppid
	if err != nil {
		t.Fatal(err)
	}
	before, _ := stat(postmaster)

	// Burn at least 200 ms of the backend's CPU, then disconnect.
	var used procCPU
	for used.ticks < 20 {
		if _, err := conn.Exec(ctx, `SELECT count(*) FROM generate_series(1, 3000000)`); err != nil {
			t.Fatal(err)
		}
		used, _ = stat(backend)
	}
	conn.Close(ctx)
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(backend)); os.IsNotExist(err) {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the backend did not end")
		}
		time.Sleep(10 * time.Millisecond)
	}
	after, _ := stat(postmaster)
	if got := after.ticks - before.ticks; got < used.ticks {
		t.Fatalf("Postgres's count grew by %d ticks while a backend that used %d ended", got, used.ticks)
	}
}
