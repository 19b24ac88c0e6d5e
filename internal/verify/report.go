package verify

import (
	"time"
)

// Report is what [Run] found. OK reports whether nothing is missing or
// duplicated.
type Report struct {
	Table  string    `json:"table"`
	Stream string    `json:"stream"`
	Since  time.Time `json:"since"`
	Until  time.Time `json:"until"`
	// SlackSeconds is Config.Slack.
	SlackSeconds float64 `json:"slack_seconds"`
	Scan         Scan    `json:"scan"`
	// MoreScans are Config.MoreStreams', in order.
	MoreScans []StreamScan `json:"more_scans,omitempty"`
	// Outbox checks rows the relay recorded delivered to JetStream
	// (nats_delivered_at in the window).
	Outbox Check `json:"outbox"`
	// Backfill checks ids `relayd backfill` moved (moved_at in the window).
	Backfill Check `json:"backfill"`
	// StreamDuplicates lists every Nats-Msg-Id found at more than one
	// sequence in the scanned range, whatever published it.
	StreamDuplicates Duplicates `json:"stream_duplicates"`
	// Duration is how long the run took.
	Duration        time.Duration `json:"-"`
	DurationSeconds float64       `json:"duration_seconds"`
}

// Scan describes the part of the stream that was read.
type Scan struct {
	// From and To are the stream timestamps the scan covered at most:
	// Since - Slack - the stream's duplicate window, and Until + Slack.
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// LastSeqAtStart is the stream's last sequence when the scan began;
	// the scan reads no further.
	LastSeqAtStart uint64 `json:"last_seq_at_start"`
	// FirstSeq and LastSeq are the first and last sequence read (0: none).
	FirstSeq uint64 `json:"first_seq"`
	LastSeq  uint64 `json:"last_seq"`
	// Messages is how many messages were read; WithoutMsgID how many of
	// them had no Nats-Msg-Id (counted, not an error, not checked).
	Messages     int64 `json:"messages"`
	WithoutMsgID int64 `json:"without_msg_id"`
}

// StreamScan is the scan of one of Config.MoreStreams.
type StreamScan struct {
	Stream string `json:"stream"`
	Scan   Scan   `json:"scan"`
}

// Check is the outcome for one ledger (the outbox or the backfill record).
type Check struct {
	// Checked is how many ids the ledger records in the window.
	Checked int64 `json:"checked"`
	// Missing ids are recorded as delivered but are not in the scanned range.
	Missing         int64     `json:"missing"`
	MissingExamples []Missing `json:"missing_examples"`
	// Duplicated ids are in the scanned range more than once.
	Duplicated         int64       `json:"duplicated"`
	DuplicatedExamples []Duplicate `json:"duplicated_examples"`
}

// Missing is one id recorded as delivered and not found in the stream.
type Missing struct {
	ID string `json:"id"`
	// At is when the ledger recorded it (nats_delivered_at or moved_at).
	At time.Time `json:"at"`
}

// Duplicate is one Nats-Msg-Id stored at more than one sequence.
type Duplicate struct {
	ID string `json:"id"`
	// Copies is how many times it is in the scanned range.
	Copies int64 `json:"copies"`
	// Seqs are its stream sequences, in order (the first 20 at most).
	Seqs []uint64 `json:"seqs"`
}

// Duplicates is the stream-wide duplicate finding.
type Duplicates struct {
	// IDs is how many distinct ids are stored more than once; Extra how
	// many copies beyond the first there are in all.
	IDs      int64       `json:"ids"`
	Extra    int64       `json:"extra_copies"`
	Examples []Duplicate `json:"examples"`
}

// OK reports whether nothing is missing or duplicated.
func (r Report) OK() bool {
	return r.Outbox.Missing == 0 && r.Outbox.Duplicated == 0 &&
		r.Backfill.Missing == 0 && r.Backfill.Duplicated == 0 &&
		r.StreamDuplicates.IDs == 0
}
