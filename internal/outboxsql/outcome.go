package outboxsql

// Outcome is what a batch did for one row on one target, as the record
// statement takes it (RecordParams; sql/record.sql's stateAfter).
type Outcome int16

// The outcomes. Their numbers are written only here: the SQL gets them as
// template fields (outcomes).
const (
	OutcomeNone      Outcome = 0 // not attempted: the target did not want the row
	OutcomeDelivered Outcome = 1 // the broker has it
	OutcomeRetry     Outcome = 2 // failed: an attempt, retried after the backoff
	OutcomeParked    Outcome = 3 // parked: not retried until an operator says so
	OutcomeOutage    Outcome = 4 // the broker unavailable: retried after the backoff, not an attempt
)

// outcomeCodes is the outcomes as the templates see them ({{.Outcome.Delivered}}).
type outcomeCodes struct{ None, Delivered, Retry, Parked, Outage int16 }

var outcomes = outcomeCodes{
	None: int16(OutcomeNone), Delivered: int16(OutcomeDelivered), Retry: int16(OutcomeRetry),
	Parked: int16(OutcomeParked), Outage: int16(OutcomeOutage),
}
