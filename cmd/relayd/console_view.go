package main

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/metrics"
	"github.com/relayd/relayd/internal/pghealth"
	"github.com/relayd/relayd/internal/phase"
	"github.com/relayd/relayd/internal/replay"
	"github.com/relayd/relayd/relay"
)

// consoleView is one rendering of the console: every text formatted, and
// scrubbed where it comes from an error, so that console.html only lays it
// out.
type consoleView struct {
	Refresh       int // seconds
	RefreshText   string
	Generated     string
	FiguresNote   string
	Phase         phaseView
	Targets       []targetView
	Instances     []instanceView
	InstancesNote string
	Parked        parkedView
	Cutover       cutoverSectionView
	Runs          linesView
	Horizon       horizonView
}

type phaseView struct {
	Name      string // amqp, dual, nats, or none
	Described string
	Set       string
	Running   string
	Notes     []string
	Astray    []string
	History   []historyView // newest first
}

type historyView struct {
	At, Phase, By, Reason string
	Forced                bool
}

type targetView struct {
	Name    string
	State   string // ok or paused
	Running bool   // this relay publishes to it in its phase

	Lag, Pending, Retrying, Parked, HeldKeys string
	Reason, LastError, Note                  string
	Chart                                    chartView
}

type chartView struct {
	Width, Height int
	Points        string
	Label         string
}

type instanceView struct {
	Name, Phase, Version, Since, Seen string
	Pinned, Astray, Self              bool
}

type parkedView struct {
	Note     string
	Rows     []parkedRowView
	Commands []string
}

type parkedRowView struct {
	ID                                        int64
	Topic, Target, Attempts, ParkedAt, Reason string
}

type cutoverSectionView struct {
	Groups []string
	HowTo  string
}

type linesView struct{ Lines []string }

type horizonView struct {
	Lines  []string
	Held   bool
	Tables string
}

// consoleInput is what one rendering is made of.
type consoleInput struct {
	now      time.Time
	interval time.Duration
	table    string
	self     string // this relay's instance name
	data     pageData
	figures  figuresSnapshot
	health   pghealth.Health // with the ages metrics.Postgres works out
	healthAt time.Time       // zero: not read yet
	phase    relay.PhaseState
	unready  []string
	groups   []cutover.Group
}

func buildConsoleView(in consoleInput) consoleView {
	refresh := max(1, int(math.Ceil(in.interval.Seconds())))
	why, other := pausedWhy(in.unready)
	v := consoleView{
		Refresh:     refresh,
		RefreshText: durationText(in.interval),
		Generated:   timeText(in.now),
		FiguresNote: "figures " + readAgo(in.figures.statsAt, in.now),
		Phase:       phaseSection(in, other),
		Targets:     targetCards(in, why),
		Parked:      parkedSection(in),
		Cutover:     cutoverSection(in.groups),
		Runs:        runsSection(in),
		Horizon:     horizonSection(in),
	}
	v.Instances, v.InstancesNote = instanceRows(in)
	return v
}

// readAgo says when figures were read: "read 2s ago", "not read yet".
func readAgo(at, now time.Time) string {
	if at.IsZero() {
		return "not read yet"
	}
	return "read " + agoText(now.Sub(at))
}

// pausedWhy splits the relay's Unready lines ("nats: why") into why each
// target is paused, and the other lines.
func pausedWhy(unready []string) (why map[relay.Target]string, other []string) {
	why = map[relay.Target]string{}
	for _, line := range unready {
		name, reason, _ := strings.Cut(line, ": ")
		if t := relay.Target(name); slices.Contains(relay.Targets, t) {
			why[t] = reason
			continue
		}
		other = append(other, line)
	}
	return why, other
}

func phaseSection(in consoleInput, unready []string) phaseView {
	st := in.data.phase
	v := phaseView{Name: "none", Described: phaseNotSet, Running: runningPhaseLine(in.phase)}
	switch {
	case st.Phase != nil:
		p := st.Phase
		v.Name, v.Described = string(p.Phase), describe(p.Phase)
		v.Set = fmt.Sprintf("Set %s by %s", timeText(p.ChangedAt), p.ChangedBy)
		if p.Reason != "" {
			v.Set += ": " + p.Reason
		}
	case in.data.errs["phase"] != nil && in.phase.Table != nil:
		// Not read now: the table's phase as this relay last read it.
		n := phase.Of(in.phase.Table)
		v.Name, v.Described = string(n), describe(n)+", as this relay last read it"
	}
	if err := in.data.errs["phase"]; err != nil {
		v.Notes = append(v.Notes, "Could not read the phase, its history and the relays: "+scrub(err.Error()))
	}
	for _, line := range unready {
		v.Notes = append(v.Notes, scrub(line))
	}
	for _, r := range st.Relays {
		if !r.Differs {
			continue
		}
		how := "follows the table: it switches within " + phase.BeatEvery.String()
		if r.Pinned {
			how = "pinned by its RELAY_TARGETS: unset it and restart that relay"
		}
		v.Astray = append(v.Astray, fmt.Sprintf("%s runs %s (%s)", r.Instance.Instance, r.Phase, how))
	}
	for _, c := range slices.Backward(st.History) {
		v.History = append(v.History, historyView{At: timeText(c.ChangedAt), Phase: string(c.Phase), By: c.ChangedBy, Reason: cmp.Or(c.Reason, "—"), Forced: c.Forced})
	}
	return v
}

func targetCards(in consoleInput, why map[relay.Target]string) []targetView {
	out := make([]targetView, 0, len(relay.Targets))
	for i, t := range relay.Targets {
		v := targetView{Name: string(t), State: "ok", Running: slices.Contains(in.phase.Running, t),
			Lag: "—", Pending: "—", Retrying: "—", Parked: "—", HeldKeys: "—"}
		if r := why[t]; r != "" {
			v.State, v.Reason = "paused", scrub(r)
		}
		j := slices.IndexFunc(in.figures.stats, func(s relay.TargetStats) bool { return s.Target == t })
		switch {
		case j >= 0:
			s := in.figures.stats[j]
			lag := time.Duration(0)
			if s.Pending > 0 { // it grows while the figures age, as the lag gauge does
				lag = s.Lag + in.now.Sub(in.figures.statsAt)
			}
			v.Lag, v.Pending = durationText(lag), strconv.FormatInt(s.Pending, 10)
			if !s.PendingExact {
				v.Pending = "~" + v.Pending
			}
			v.Retrying, v.Parked, v.HeldKeys = strconv.FormatInt(s.Retrying, 10), strconv.FormatInt(s.Parked, 10), strconv.FormatInt(s.HeldKeys, 10)
			v.LastError = scrub(s.LastError)
		case !v.Running:
			v.Note = fmt.Sprintf("This relay does not publish to %s in its phase, %s.", t, phase.Of(in.phase.Running))
		default:
			v.Note = "Its figures are not read yet."
		}
		v.Chart = lagChart(in.figures.lags, i, in.now)
		out = append(out, v)
	}
	return out
}

// The lag chart's viewBox.
const chartWidth, chartHeight = 300, 60

// lagChart draws target i's lag over the last lagWindow as a polyline,
// scaled to its highest lag (at least a second).
func lagChart(samples []lagSample, i int, now time.Time) chartView {
	c := chartView{Width: chartWidth, Height: chartHeight}
	from := now.Add(-lagWindow)
	top := time.Second
	n := 0
	for _, s := range samples {
		if s.has[i] && !s.at.Before(from) {
			top = max(top, s.lag[i])
			n++
		}
	}
	if n < 2 {
		c.Label = "lag over the last 15 minutes: too few readings yet"
		return c
	}
	var b strings.Builder
	for _, s := range samples {
		if !s.has[i] || s.at.Before(from) {
			continue
		}
		x := float64(s.at.Sub(from)) / float64(lagWindow) * chartWidth
		y := chartHeight - 1 - float64(s.lag[i])/float64(top)*(chartHeight-2)
		fmt.Fprintf(&b, "%.1f,%.1f ", x, y)
	}
	c.Points = strings.TrimSpace(b.String())
	c.Label = "lag over the last 15 minutes, at most " + durationText(top)
	return c
}

func instanceRows(in consoleInput) ([]instanceView, string) {
	st := in.data.phase
	since := in.now.Sub(in.data.readAt) // the reports' ages are as of the read
	var out []instanceView
	for _, r := range st.Relays {
		out = append(out, instanceView{
			Name: r.Instance.Instance, Phase: string(r.Phase), Version: r.Version, Pinned: r.Pinned,
			Since: timeText(r.StartedAt), Seen: agoText(r.Age + since), Astray: r.Differs, Self: r.Instance.Instance == in.self,
		})
	}
	switch {
	case in.data.errs["phase"] != nil:
		return out, "Could not read the relays' reports."
	case len(out) == 0:
		return out, "No relay reports itself (none running, or this relay has not reported yet)."
	}
	return out, fmt.Sprintf("Relays that reported within %s; each reports every %s.", phase.Seen, phase.BeatEvery)
}

func parkedSection(in consoleInput) parkedView {
	var v parkedView
	if err := in.data.errs["parked"]; err != nil {
		v.Note = "Could not read the parked rows: " + scrub(err.Error())
		return v
	}
	ids := map[relay.Target][]int64{}
	for _, r := range in.data.parked {
		row := parkedRowView{ID: r.ID, Topic: r.Topic}
		var targets, attempts, reasons []string
		var at time.Time
		for _, p := range r.Targets {
			targets = append(targets, string(p.Target))
			attempts = append(attempts, fmt.Sprintf("%s %d", p.Target, p.Attempts))
			reasons = append(reasons, string(p.Target)+": "+scrub(p.Reason))
			if p.ParkedAt.After(at) {
				at = p.ParkedAt
			}
			ids[p.Target] = append(ids[p.Target], r.ID)
		}
		row.Target, row.ParkedAt = strings.Join(targets, ", "), timeText(at)
		if len(r.Targets) == 1 {
			row.Attempts, row.Reason = strconv.Itoa(r.Targets[0].Attempts), scrub(r.Targets[0].Reason)
		} else {
			row.Attempts, row.Reason = strings.Join(attempts, ", "), strings.Join(reasons, " · ")
		}
		v.Rows = append(v.Rows, row)
	}
	if len(v.Rows) == 0 {
		v.Note = "No row is parked."
		return v
	}
	v.Note = "The parked row written last."
	if len(v.Rows) > 1 {
		v.Note = fmt.Sprintf("The %d parked rows written last (the highest ids), the last first.", len(v.Rows))
	}
	var counts []string
	for _, s := range in.figures.stats {
		counts = append(counts, fmt.Sprintf("%s %d", s.Target, s.Parked))
	}
	if len(counts) > 0 {
		v.Note += " Parked in all, by target: " + strings.Join(counts, ", ") + " (relayd outbox parked lists them all)."
	}
	env := ""
	if in.table != defaultTable {
		env = "RELAY_OUTBOX_TABLE=" + in.table + " "
	}
	for _, t := range relay.Targets {
		if len(ids[t]) == 0 {
			continue
		}
		slices.Sort(ids[t])
		list := make([]string, len(ids[t]))
		for i, id := range ids[t] {
			list[i] = strconv.FormatInt(id, 10)
		}
		v.Commands = append(v.Commands, fmt.Sprintf("%srelayd outbox retry --target %s --id %s", env, t, strings.Join(list, ",")))
	}
	v.Commands = append(v.Commands, env+"relayd outbox retry --all")
	return v
}

// defaultTable is RELAY_OUTBOX_TABLE's default: a command for it needs no
// RELAY_OUTBOX_TABLE.
const defaultTable = "outbox"

func cutoverSection(groups []cutover.Group) cutoverSectionView {
	if len(groups) == 0 {
		return cutoverSectionView{HowTo: consoleCutoverHowTo}
	}
	var v cutoverSectionView
	for _, g := range groups {
		line := fmt.Sprintf("%s: %s, consumer %s of stream %s", g.Name(), g.Path, g.Consumer, g.Stream)
		if g.Queue != "" {
			line += ", legacy queue " + g.Queue
		} else {
			line += ", moved off its legacy queue"
		}
		v.Groups = append(v.Groups, line)
	}
	return v
}

const consoleCutoverHowTo = "No consumer group is configured for the check. Set RELAY_CONSOLE_CUTOVER to the groups " +
	"as relayd cutover check takes them, PATH=[STREAM/]DURABLE[:QUEUE] separated by spaces, PATH dual-read or " +
	"rolling-upgrade (e.g. RELAY_CONSOLE_CUTOVER=\"dual-read=ORDERS/billing:q_billing rolling-upgrade=ledger:q_ledger\"), " +
	"and restart relayd; or run relayd cutover check from a shell."

func runsSection(in consoleInput) linesView {
	var v linesView
	if err := in.data.errs["runs"]; err != nil {
		v.Lines = append(v.Lines, "Could not read the backfill's and the replay's records: "+scrub(err.Error()))
		return v
	}
	v.Lines = append(v.Lines, replayLine(in.data.replay, in.data.pace, in.table, in.now))
	if len(in.data.moved) == 0 {
		v.Lines = append(v.Lines, fmt.Sprintf("No backfill has moved a message in the last %s.", durationText(backfillWindow)))
	}
	for _, m := range in.data.moved {
		v.Lines = append(v.Lines, fmt.Sprintf("Backfill of queue %s: %d moved in the last %s, %s averaged over it; the last move %s.",
			m.Queue, m.Count, durationText(backfillWindow), rateText(float64(m.Count)/backfillWindow.Seconds()), agoText(in.now.Sub(m.Last))))
	}
	v.Lines = append(v.Lines, "A backfill records only the ids it moves (in "+in.table+"_backfilled), not how many its queue holds: "+
		"its progress and the messages left are on its own metrics (relayd backfill --metrics-addr: relayd_backfill_moved_total, "+
		"relayd_backfill_queue_depth_at_start), so no progress or ETA for it here.")
	return v
}

// replayStalled is how long without progress before the page says a replay
// run stopped.
const replayStalled = time.Minute

// replayLine says what the latest replay run did, or where it is, and with
// its pace since the page's last read, how fast it goes and when it should
// end.
func replayLine(r *replay.Record, pace *replayPace, table string, now time.Time) string {
	switch {
	case r == nil:
		return "No replay run is recorded (" + table + "_replay)."
	case r.FinishedAt != nil && r.Abandoned:
		return fmt.Sprintf("The last replay run, %d, was abandoned %s (relayd replay --restart).", r.ID, agoText(now.Sub(*r.FinishedAt)))
	case r.FinishedAt != nil:
		return fmt.Sprintf("The last replay run, %d, finished %s: %d sent to %s, %d skipped, %d failed for good.",
			r.ID, agoText(now.Sub(*r.FinishedAt)), r.Sent, r.Exchange, r.Skipped(), r.FailedPermanent)
	}
	total := int64(r.ToSeq) - int64(r.FromSeq) + 1
	done := min(max(int64(r.Position)-int64(r.FromSeq)+1, 0), total)
	line := fmt.Sprintf("Replay run %d, stream %s to exchange %s: sequence %d of %d–%d, %d of %d done (%.1f %%)",
		r.ID, r.Stream, r.Exchange, r.Position, r.FromSeq, r.ToSeq, done, total, 100*float64(done)/float64(max(total, 1)))
	switch left := total - done; {
	case pace == nil:
		line += "; rate and ETA once the page has read it twice"
	case pace.perSecond > 0 && left > 0:
		line += fmt.Sprintf(", %s over the %s since the page last read it, about %s left at that rate",
			rateText(pace.perSecond), durationText(pace.over), durationText(time.Duration(float64(left)/pace.perSecond*float64(time.Second))))
	default:
		line += fmt.Sprintf(", %s over the %s since the page last read it", rateText(pace.perSecond), durationText(pace.over))
	}
	line += "; last progress " + agoText(now.Sub(r.UpdatedAt)) + "."
	if now.Sub(r.UpdatedAt) > replayStalled {
		line += " It is not moving: the run stopped (interrupted or failed); relayd replay resumes it."
	}
	return line
}

// horizonSection says who holds VACUUM's horizon back, as the metrics and
// their alerts do: a holder from HolderInfoAfter on, its age from when
// relayd first saw it where Postgres does not give it.
func horizonSection(in consoleInput) horizonView {
	if in.healthAt.IsZero() {
		return horizonView{Lines: []string{"VACUUM's horizon: not read yet."}}
	}
	v := horizonView{Tables: "relayd's tables: " + tablesText(in.health) + " (" + readAgo(in.healthAt, in.now) + ")"}
	x, ok := in.health.Oldest()
	if ok && x.Age >= metrics.HolderInfoAfter {
		held := holderText(x)
		if !x.AgeKnown {
			held = holderTextAged(x, "for at least "+durationText(x.Age)+" (since relayd first saw it)")
		}
		v.Held = true
		v.Lines = append(v.Lines, "VACUUM's horizon is "+held+
			": while it runs, the rows relayd deletes stay on disk and its tables and indexes grow (docs/operations.md, \"Long transactions\").")
		return v
	}
	v.Lines = append(v.Lines, "Nothing holds VACUUM's horizon back for long.")
	return v
}

// timeText is t in UTC, to the second.
func timeText(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// durationText is d rounded for a reader: 250ms, 12s, 3m20s, 2h5m.
func durationText(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return strings.TrimSuffix(d.Round(time.Minute).String(), "0s")
}

func agoText(d time.Duration) string {
	if d < time.Second {
		return "just now"
	}
	return durationText(d) + " ago"
}

func rateText(perSecond float64) string {
	switch {
	case perSecond >= 10:
		return fmt.Sprintf("%.0f msg/s", perSecond)
	case perSecond >= 1 || perSecond == 0:
		return fmt.Sprintf("%.1f msg/s", perSecond)
	}
	return fmt.Sprintf("%.2f msg/s", perSecond)
}
