package replay

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/relayd/relayd/internal/phase"
)

// Margin widens a window taken from the phase history on both sides. Before
// its start rows were dual-written, and are skipped by the lookups anyway;
// after its end, batches claimed in the nats-only phase still finish under
// it.
const Margin = time.Minute

// Request is the window the operator asked for; its zero value asks for the
// table's latest nats-only period.
type Request struct {
	Since   time.Time // read from the first message stored at or after it
	FromSeq uint64    // or from this stream sequence
	ToSeq   uint64    // up to this sequence (0: see Window.End)
}

// IsZero reports whether nothing was asked for.
func (r Request) IsZero() bool { return r.Since.IsZero() && r.FromSeq == 0 && r.ToSeq == 0 }

func (r Request) check() error {
	switch {
	case !r.Since.IsZero() && r.FromSeq > 0:
		return errors.New("replay: Since and FromSeq exclude each other")
	case r.ToSeq > 0 && r.FromSeq > r.ToSeq:
		return fmt.Errorf("replay: FromSeq %d is past ToSeq %d", r.FromSeq, r.ToSeq)
	}
	return nil
}

// ErrNoPeriod: the history has no nats-only period and the request names no
// start.
var ErrNoPeriod = errors.New("the phase history has no nats-only period: give --since or --from-seq")

// Window is a request made definite by the phase history: where the read
// starts and ends, by time or sequence. The stream turns it into sequences
// (resolve).
type Window struct {
	Source  string    // "phase", "since" or "seq": where the start came from
	Start   time.Time // from the first message stored at or after it (zero: FromSeq)
	FromSeq uint64
	End     time.Time // stop at the first message stored after it (zero: none)
	ToSeq   uint64    // the last sequence (0: the stream's last at the start)
	Ongoing bool      // the nats-only period has not ended
}

// Stranded is what the delivered record says of the rows finished without
// RabbitMQ since the latest nats-only period began: the earliest and latest
// JetStream delivery among them (zero: none).
type Stranded struct{ Earliest, Latest time.Time }

// Plan makes r definite against the phase history (oldest first). A start
// not given is the earlier of the latest nats-only period's start and
// s.Earliest (rows RabbitMQ owed at the move reached JetStream before it),
// less Margin. An end not given, when the start came from the period and it
// has ended, is the later of its end and s.Latest (batches claimed in it
// that recorded after it), plus Margin.
func Plan(r Request, history []phase.Change, s Stranded) (Window, error) {
	if err := r.check(); err != nil {
		return Window{}, err
	}
	w := Window{Start: r.Since, FromSeq: r.FromSeq, ToSeq: r.ToSeq}
	switch {
	case r.FromSeq > 0:
		w.Source = "seq"
	case !r.Since.IsZero():
		w.Source = "since"
	default:
		p, ok := phase.LastPeriod(history, phase.NATS)
		if !ok {
			return Window{}, ErrNoPeriod
		}
		w.Source, w.Start = "phase", p.Start
		if !s.Earliest.IsZero() && s.Earliest.Before(w.Start) {
			w.Start = s.Earliest
		}
		w.Start = w.Start.Add(-Margin)
		if r.ToSeq == 0 {
			if p.End.IsZero() {
				w.Ongoing = true
			} else {
				w.End = p.End
				if s.Latest.After(w.End) {
					w.End = s.Latest
				}
				w.End = w.End.Add(Margin)
			}
		}
	}
	return w, nil
}

// Key is the window as the run's record keeps it, so a rerun can tell
// whether it asks for the same one.
func (w Window) Key() string {
	var parts []string
	switch {
	case w.FromSeq > 0:
		parts = append(parts, fmt.Sprintf("from-seq=%d", w.FromSeq))
	case !w.Start.IsZero():
		parts = append(parts, w.Source+"="+w.Start.UTC().Format(time.RFC3339Nano))
	}
	if !w.End.IsZero() {
		parts = append(parts, "until="+w.End.UTC().Format(time.RFC3339Nano))
	}
	if w.ToSeq > 0 {
		parts = append(parts, fmt.Sprintf("to-seq=%d", w.ToSeq))
	}
	return strings.Join(parts, ",")
}
