package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Routes is the cost of relayd's routes (issue #45): the same dual-write
// burn-down, rows spread over routesTopics topics, by the default route and
// by routesTopics routes to three exchanges and two streams, the runs
// alternating.
type Routes struct {
	Targets string     `json:"targets"`
	Rows    int        `json:"rows"`
	Topics  int        `json:"topics"`
	Rounds  int        `json:"rounds"` // runs per arm
	Default RoutesArm  `json:"default"`
	Routed  RoutesArm  `json:"routed"`
	Ratio   float64    `json:"ratio"` // Routed.RowsPerSecond / Default.RowsPerSecond
	Order   []string   `json:"order"`
	Runs    []Burndown `json:"runs"`
}

// RoutesArm is one arm's runs: the best counts, as with tracing.
type RoutesArm struct {
	RowsPerSecond    float64   `json:"rows_per_second"`
	Samples          []float64 `json:"samples_rows_per_second"`
	CPUSecondsPer10k float64   `json:"cpu_seconds_per_10k_rows"` // of the best run
	PeakRSSMiB       float64   `json:"peak_rss_mib"`
}

const (
	routesTopics    = 10
	routesExchanges = 3
	routesRounds    = 3
)

// routed makes the estate the routes point at beside corner c — three
// exchanges, bound to c's queue so that RabbitMQ routes every message, a
// second stream — and writes the routes file: route i takes topic
// bench.t<i>.msg (fillTopics) to exchange i mod 3 (with a key of its own)
// and to stream i mod 2.
func (b *bench) routed(ctx context.Context, c *corner) (env []string, err error) {
	ch, err := b.amqpConn.Channel()
	if err != nil {
		return nil, err
	}
	defer ch.Close()
	var exchanges []string
	for i := range routesExchanges {
		x := fmt.Sprintf("%s_x%d", c.name, i)
		if err := ch.ExchangeDeclare(x, "topic", true, false, false, false, nil); err != nil {
			return nil, err
		}
		c.extraExchanges = append(c.extraExchanges, x)
		if err := ch.QueueBind(c.queue, "#", x, false, nil); err != nil {
			return nil, err
		}
		exchanges = append(exchanges, x)
	}
	second, prefix := c.stream+"_B", c.name+"b."
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: second, Subjects: []string{prefix + ">"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute}); err != nil {
		return nil, fmt.Errorf("create stream: %w", err)
	}
	c.extraStreams = append(c.extraStreams, second)
	var f strings.Builder
	f.WriteString("routes:\n")
	for i := range routesTopics {
		stream, subject := c.stream, fmt.Sprintf("%st%d.{2}", c.prefix, i)
		if i%2 == 1 {
			stream, subject = second, fmt.Sprintf("%st%d.{2}", prefix, i)
		}
		fmt.Fprintf(&f, "  - name: r%d\n    topic: \"*.t%d.>\"\n    amqp: {exchange: %q, routing_key: \"legacy.{1}.{2}\"}\n    nats: {subject: %q, stream: %s}\n",
			i, i, exchanges[i%routesExchanges], subject, stream)
	}
	path := filepath.Join(b.tmpDir, c.name+"-routes.yaml")
	if err := os.WriteFile(path, []byte(f.String()), 0o600); err != nil {
		return nil, err
	}
	return []string{"RELAY_ROUTES=" + path}, nil
}

// routesRun measures the dual-write burn-down by the default route and by
// the routes, runs alternating.
func (b *bench) routesRun(ctx context.Context, res *Results) error {
	rounds := routesRounds
	if b.o.Smoke {
		rounds = 1
	}
	r := &Routes{Targets: "amqp,nats", Rows: b.tracingRows(), Topics: routesTopics, Rounds: rounds}
	res.Routes = r
	var best [2]Burndown
	for range rounds {
		for i, arm := range []struct {
			name  string
			setup func(context.Context, *corner) ([]string, error)
			a     *RoutesArm
		}{{"default", nil, &r.Default}, {"routed", b.routed, &r.Routed}} {
			b.logf("routes %s: burn-down %s rows over %d topics, RELAY_TARGETS=%s, 1 instance", arm.name, thousands(float64(r.Rows)), r.Topics, r.Targets)
			bd, note, err := b.burndownRun(ctx, burnSpec{targets: r.Targets, instances: 1, rows: r.Rows, topics: r.Topics, setup: arm.setup})
			if err != nil {
				return fmt.Errorf("routes %s: %w", arm.name, err)
			}
			b.logf("  %s rows/s, %.2f CPU s/10k rows, peak RSS %.0f MiB", thousands(bd.RowsPerSecond), bd.CPUSecondsPer10k, bd.PeakRSSMiB)
			if note != "" {
				res.Notes = append(res.Notes, "routes "+arm.name+": "+note)
			}
			arm.a.Samples = append(arm.a.Samples, bd.RowsPerSecond)
			arm.a.PeakRSSMiB = max(arm.a.PeakRSSMiB, bd.PeakRSSMiB)
			if bd.RowsPerSecond > best[i].RowsPerSecond {
				best[i] = bd
			}
			r.Order = append(r.Order, arm.name)
			r.Runs = append(r.Runs, bd)
			b.settle(ctx)
		}
	}
	r.Default.RowsPerSecond, r.Default.CPUSecondsPer10k = best[0].RowsPerSecond, best[0].CPUSecondsPer10k
	r.Routed.RowsPerSecond, r.Routed.CPUSecondsPer10k = best[1].RowsPerSecond, best[1].CPUSecondsPer10k
	if r.Default.RowsPerSecond > 0 {
		r.Ratio = round(r.Routed.RowsPerSecond/r.Default.RowsPerSecond, 3)
	}
	b.logf("routes: routed/default %.3f (best of %d each)", r.Ratio, rounds)
	return nil
}

func routesTarget(r *Routes) string {
	return fmt.Sprintf("routes: burn-down %s rows/s, %d routes over %d exchanges and 2 streams vs the default route", r.Targets, r.Topics, routesExchanges)
}

// writeRoutes prints the routes section.
func writeRoutes(w io.Writer, res *Results, r *Routes) {
	fmt.Fprintf(w, "| routes: burn-down %s, %s rows over %d topics, 1 instance (runs alternating %s) | rows/s (best of %d) | samples | relayd CPU s / 10k | peak RSS |\n|---|---:|---|---:|---:|\n",
		r.Targets, thousands(float64(r.Rows)), r.Topics, strings.Join(r.Order, "/"), r.Rounds)
	for _, arm := range []struct {
		name string
		a    RoutesArm
	}{{"the default route", r.Default}, {fmt.Sprintf("%d routes, %d exchanges, 2 streams", r.Topics, routesExchanges), r.Routed}} {
		samples := make([]string, len(arm.a.Samples))
		for i, s := range arm.a.Samples {
			samples[i] = thousands(s)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %.2f | %.0f MiB |\n", arm.name, thousands(arm.a.RowsPerSecond), strings.Join(samples, ", "), arm.a.CPUSecondsPer10k, arm.a.PeakRSSMiB)
	}
	target := ""
	if v := res.verdictFor(routesTarget(r)); v != nil {
		target = ": " + targetCell(v)
	}
	fmt.Fprintf(w, "| routed / default%s | %s | | | |\n\n", target, strconv.FormatFloat(r.Ratio, 'f', 3, 64))
}
