package main

import (
	"os"
	"strconv"
	"strings"
)

// On a small machine every service shares the same cores, so where the
// CPU went during a run says as much as the rate: cpuSnap reads the CPU
// time of every process and of the whole machine from /proc (Linux; empty
// elsewhere) and cpuSplit turns two snapshots into core-seconds per service.

type cpuSnap struct {
	procs      map[int]procCPU
	total, idl uint64 // machine: all jiffies, idle + iowait jiffies
}

type procCPU struct {
	comm  string
	ticks uint64 // utime + stime (Postgres: + cutime + cstime, see procStat)
}

// clkTck is USER_HZ, 100 on every Linux that matters.
const clkTck = 100

func takeCPUSnap() cpuSnap {
	s := cpuSnap{procs: map[int]procCPU{}}
	if data, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(data), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			s.total += n
			if i == 3 || i == 4 { // idle, iowait
				s.idl += n
			}
		}
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return s
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if p, ok := procStat(string(data)); ok {
			s.procs[pid] = p
		}
	}
	return s
}

// procStat reads a /proc/PID/stat line. A Postgres process's figure
// includes its children's that have ended (cutime, cstime): the
// postmaster's children are the backends, one per connection, and a
// backend whose client disconnected before the second snapshot (the
// backfill's, which exits before the bench looks) would otherwise take
// its CPU with it.
func procStat(st string) (procCPU, bool) {
	open, end := strings.IndexByte(st, '('), strings.LastIndexByte(st, ')')
	if open < 0 || end < open {
		return procCPU{}, false
	}
	f := strings.Fields(st[end+1:])
	if len(f) < 15 {
		return procCPU{}, false
	}
	p := procCPU{comm: st[open+1 : end]}
	fields := f[11:13] // utime, stime
	if p.comm == "postgres" {
		fields = f[11:15] // and cutime, cstime
	}
	for _, v := range fields {
		n, _ := strconv.ParseUint(v, 10, 64)
		p.ticks += n
	}
	return p, true
}

// CPUSplit is where the machine's CPU went during a measurement.
type CPUSplit struct {
	BusyPercent float64 `json:"machine_busy_percent"` // of all cores
	// Core-seconds per 10k rows (or messages), per service: Postgres,
	// RabbitMQ and NATS are every process of theirs (other clients' work
	// included), relayd only the benchmark's relayd processes, bench the
	// benchmark itself (the clients of the ceilings, the producers and
	// consumers of the latency runs), other everything else on the machine.
	Postgres float64 `json:"postgres"`
	RabbitMQ float64 `json:"rabbitmq"`
	NATS     float64 `json:"nats"`
	Relayd   float64 `json:"relayd"`
	Bench    float64 `json:"bench"`
	Other    float64 `json:"other"`
}

// cpuSplit compares two snapshots; processes that started in between count
// from zero, processes that ended in between are not seen (but for
// Postgres's backends: procStat). ours are the benchmark's relayd processes.
func cpuSplit(a, b cpuSnap, n int, ours ...*proc) *CPUSplit {
	if b.total <= a.total || n == 0 {
		return nil
	}
	s := &CPUSplit{BusyPercent: round(100*(1-float64(b.idl-a.idl)/float64(b.total-a.total)), 0)}
	per10k := func(ticks uint64) float64 { return float64(ticks) / clkTck / (float64(n) / 10000) }
	mine := map[int]bool{}
	for _, p := range ours {
		mine[p.cmd.Process.Pid] = true
	}
	self := os.Getpid()
	var pg, rmq, nats, relayd, bench, other uint64
	for pid, p := range b.procs {
		d := p.ticks
		if old, ok := a.procs[pid]; ok && old.comm == p.comm {
			d -= min(old.ticks, d)
		}
		switch {
		case p.comm == "postgres":
			pg += d
		case p.comm == "beam.smp" || strings.HasPrefix(p.comm, "erl_child") || p.comm == "epmd":
			rmq += d
		case p.comm == "nats-server":
			nats += d
		case mine[pid]:
			relayd += d
		case pid == self:
			bench += d
		default:
			other += d
		}
	}
	s.Postgres, s.RabbitMQ, s.NATS = round(per10k(pg), 2), round(per10k(rmq), 2), round(per10k(nats), 2)
	s.Relayd, s.Bench, s.Other = round(per10k(relayd), 2), round(per10k(bench), 2), round(per10k(other), 2)
	return s
}

// machineBusy is the share of the machine's CPU busy between two snapshots;
// false where /proc/stat cannot be read.
func machineBusy(a, b cpuSnap) (float64, bool) {
	total := b.total - a.total
	if b.total <= a.total || total == 0 {
		return 0, false
	}
	return 1 - float64(b.idl-a.idl)/float64(total), true
}
