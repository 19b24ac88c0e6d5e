package metrics

import "github.com/prometheus/client_golang/prometheus"

// NewConsoleReads registers and returns the count of the console's reads of
// its own figures from Postgres: what its viewers cost the database.
func NewConsoleReads(reg prometheus.Registerer) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "relayd_console_reads_total",
		Help: "Reads of the console's own figures from Postgres (phase history, relays, parked rows, runs): at most one per RELAY_STATS_INTERVAL, whatever the number of viewers.",
	})
	reg.MustRegister(c)
	return c
}
