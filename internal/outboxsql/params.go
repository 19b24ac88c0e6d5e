package outboxsql

import "time"

// The parameters of each statement that has any: one struct per statement
// (its variants, per target or per order, share it), a field per named
// parameter, its db tag the name. Callers pass pgx.StrictStructArgs(p) as
// the statement's only argument, which fails when the SQL and the struct
// disagree; TestParamsMatchStatements checks each pair without a database.

// ClaimParams are Claim's.
type ClaimParams struct {
	AMQPActive     bool    `db:"amqp_active"`      // RabbitMQ is an active target
	NATSActive     bool    `db:"nats_active"`      // JetStream is an active target
	AMQPEnabled    bool    `db:"amqp_enabled"`     // the phase sends RabbitMQ rows (paused or not)
	NATSEnabled    bool    `db:"nats_enabled"`     // the phase sends JetStream rows (paused or not)
	BatchSize      int     `db:"batch_size"`       // rows per target the batch takes at most
	SkipParkedKeys bool    `db:"skip_parked_keys"` // a parked row does not hold its key's later rows
	KeyedWindow    int     `db:"keyed_window"`     // the oldest keyed rows per target the heads are looked for in
	KeyedRows      int     `db:"keyed_rows"`       // keyed rows per target the batch takes at most
	OwedFloor      int64   `db:"owed_floor"`       // the owed table's unkeyed walks take ids above it
	OwedSafe       int64   `db:"owed_safe"`        // the owed table's lowest unkeyed row owed is looked for above it
	OwedKeyedFloor int64   `db:"owed_keyed_floor"` // the owed table's keyed walks, and its lowest keyed row owed, above it
	HeldIDs        []int64 `db:"held_ids"`         // rows this relay's batches in flight hold: not tried
	FreshFrom      int64   `db:"fresh_from"`       // the outbox's unkeyed walk takes ids above it...
	FreshTo        int64   `db:"fresh_to"`         // ...up to this one
	Sweep          bool    `db:"sweep"`            // a sweep: return the rows its walk saw held
	KeyedFloor     int64   `db:"keyed_floor"`      // the outbox's keyed walks take ids above it
	// An owed keyed row's probe for an earlier row of its key in the
	// outbox starts above FreshKeyedFloor, or the KeyedPendingFrom of a
	// KeyedPendingXIDs transaction the claim's snapshot shows ended.
	FreshKeyedFloor  int64   `db:"fresh_keyed_floor"`
	KeyedPendingXIDs []int64 `db:"keyed_pending_xids"`
	KeyedPendingFrom []int64 `db:"keyed_pending_from"`
}

// RecheckParams are Recheck's.
type RecheckParams struct {
	AMQPActive bool    `db:"amqp_active"` // RabbitMQ is an active target
	NATSActive bool    `db:"nats_active"` // JetStream is an active target
	From       int64   `db:"from"`        // the walk takes unkeyed ids above it...
	To         int64   `db:"to"`          // ...up to this one
	HeldBefore []int64 `db:"held_before"` // and these, which it saw held before
	Limit      int     `db:"limit"`       // rows it takes at most
}

// RecordParams are Record's: column-wise, the rows still owed to a target
// (IDs and what follows it), then the rows every enabled target has
// (DoneIDs and what follows it).
type RecordParams struct {
	IDs              []int64   `db:"ids"`                // rows still owed
	AMQPOutcomes     []Outcome `db:"amqp_outcomes"`      // what the batch did on RabbitMQ, per row
	AMQPErrors       []string  `db:"amqp_errors"`        // the error of a failed RabbitMQ publish, per row
	AMQPBackoffsMS   []int64   `db:"amqp_backoffs_ms"`   // milliseconds until the RabbitMQ retry, per row
	NATSOutcomes     []Outcome `db:"nats_outcomes"`      // what the batch did on JetStream, per row
	NATSErrors       []string  `db:"nats_errors"`        // the error of a failed JetStream publish, per row
	NATSBackoffsMS   []int64   `db:"nats_backoffs_ms"`   // milliseconds until the JetStream retry, per row
	RouteExchanges   []*string `db:"route_exchanges"`    // the exchange each row went to (NULL: the sink's default)
	RouteRoutingKeys []*string `db:"route_routing_keys"` // its routing key
	RouteSubjects    []*string `db:"route_subjects"`     // its subject (NULL: no route recorded)
	RouteStreams     []*string `db:"route_streams"`      // its stream
	DoneIDs          []int64   `db:"done_ids"`           // rows every enabled target has
	AMQPDoneNow      []bool    `db:"amqp_done_now"`      // this batch delivered it to RabbitMQ (else an earlier one)
	NATSDoneNow      []bool    `db:"nats_done_now"`      // this batch delivered it to JetStream
}

// LateParams are Late's and LateWait's.
type LateParams struct {
	MessageIDs []string `db:"message_ids"` // the rows' message ids (uuids, as text)
}

// LateRouteParams are LateRoute's: column-wise, per row its route.
type LateRouteParams struct {
	IDs              []int64   `db:"ids"`                // the rows Late moved
	RouteExchanges   []*string `db:"route_exchanges"`    // the exchange each went to
	RouteRoutingKeys []*string `db:"route_routing_keys"` // its routing key
	RouteSubjects    []*string `db:"route_subjects"`     // its subject
	RouteStreams     []*string `db:"route_streams"`      // its stream
}

// FinishParams are Finish's.
type FinishParams struct {
	After int64 `db:"after"` // the slice starts past this id
	Limit int   `db:"limit"` // rows in the slice
}

// CleanupParams are CleanupDelivered's and CleanupBackfilled's.
type CleanupParams struct {
	RetentionMS int64     `db:"retention_ms"` // rows older than this many milliseconds go
	Limit       int       `db:"limit"`        // rows the statement deletes at most
	From        time.Time `db:"from"`         // rows older than this stay (where the last pass stopped, less a margin)
}

// StatsParams are the Pending and LastError statements' of Stats.
type StatsParams struct {
	Floor          int64 `db:"floor"`            // the outbox is read from this id (a relay's floor; 0: all)
	OwedFloor      int64 `db:"owed_floor"`       // the owed table's unkeyed rows above this id (0: all)
	OwedKeyedFloor int64 `db:"owed_keyed_floor"` // and its keyed rows above this one (0: all)
}

// FinishedWithoutNATSParams are FinishedWithoutNATS's.
type FinishedWithoutNATSParams struct {
	Lookback string `db:"lookback"` // how far back, an interval ("900000 milliseconds")
}

// FinishedWithoutNATSSinceParams are FinishedWithoutNATSSince's.
type FinishedWithoutNATSSinceParams struct {
	Since time.Time `db:"since"` // rows finished after it count
}

// ListParkedParams are ListParked's and ListParkedLast's.
type ListParkedParams struct {
	AMQP  bool `db:"amqp"`  // rows parked for RabbitMQ
	NATS  bool `db:"nats"`  // rows parked for JetStream
	Limit int  `db:"limit"` // rows returned at most
}

// RetryParkedParams are RetryParked's.
type RetryParkedParams struct {
	All bool    `db:"all"` // every row parked for the target
	IDs []int64 `db:"ids"` // else these rows
}

// KnownParams are Known's.
type KnownParams struct {
	UUIDs []string `db:"uuids"` // the ids that are uuids (as text)
	IDs   []string `db:"ids"`   // every id
}

// RecordMovedParams are RecordMoved's.
type RecordMovedParams struct {
	IDs     []string `db:"ids"`     // the ids moved
	Derived []bool   `db:"derived"` // whether each id was derived (the message had none)
	Queue   string   `db:"queue"`   // the legacy queue they came from
}

// BackfillMovedParams are BackfillMoved's.
type BackfillMovedParams struct {
	WindowMS int64 `db:"window_ms"` // how far back, in milliseconds
}

// VerifyParams are VerifyOutbox's and VerifyBackfill's (and VerifyRun's
// FillOutbox's and FillBackfill's).
type VerifyParams struct {
	Since time.Time `db:"since"` // the window's start
	Until time.Time `db:"until"` // the window's end
}

// ExamplesParams are the examples' statements of VerifyRun.
type ExamplesParams struct {
	Limit int `db:"limit"` // examples listed at most
}

// PhaseSetParams are PhaseSet's.
type PhaseSetParams struct {
	Phase     string `db:"phase"`      // the new phase
	ChangedBy string `db:"changed_by"` // who changed it
	Reason    string `db:"reason"`     // why
	Forced    bool   `db:"forced"`     // whether the checks were overridden
}

// InstanceBeatParams are InstanceBeat's.
type InstanceBeatParams struct {
	Instance  string    `db:"instance"`   // the relay (host:pid)
	Phase     string    `db:"phase"`      // the phase it runs
	Pinned    bool      `db:"pinned"`     // whether RELAY_TARGETS pins it
	Version   string    `db:"version"`    // its version
	StartedAt time.Time `db:"started_at"` // when it started
}

// InstanceLeaveParams are InstanceLeave's.
type InstanceLeaveParams struct {
	Instance string `db:"instance"` // the relay stopping
}

// InstancesPruneParams are InstancesPrune's.
type InstancesPruneParams struct {
	ForgetAfterMS int64 `db:"forget_after_ms"` // relays silent this many milliseconds are forgotten
}

// InstancesParams are Instances'.
type InstancesParams struct {
	SeenMS int64 `db:"seen_ms"` // relays seen within this many milliseconds
}

// ReplayDeliveredParams are ReplayDelivered's.
type ReplayDeliveredParams struct {
	UUIDs []string `db:"uuids"` // the message ids that are uuids (as text)
}

// ReplayOwedParams are ReplayOwed's.
type ReplayOwedParams struct {
	UUIDs []string `db:"uuids"` // the message ids that are uuids (as text)
}

// ReplayBackfilledParams are ReplayBackfilled's.
type ReplayBackfilledParams struct {
	IDs []string `db:"ids"` // every message id
}

// ReplayStrandedParams are ReplayStranded's.
type ReplayStrandedParams struct {
	Start time.Time  `db:"start"` // the nats-only period's start
	End   *time.Time `db:"end"`   // its end (nil: it goes on)
}

// ReplayClaimsLeftParams are ReplayClaimsLeft's.
type ReplayClaimsLeftParams struct {
	Transactions []string `db:"transactions"` // virtual transaction ids, as ReplayClaims returned them
}

// ReplayRunParams are ReplayRun's.
type ReplayRunParams struct {
	ID int64 `db:"id"` // the run
}

// ReplayOverlapParams are ReplayOverlap's.
type ReplayOverlapParams struct {
	Stream  string `db:"stream"`   // the stream replayed
	FromSeq int64  `db:"from_seq"` // the first sequence
	ToSeq   int64  `db:"to_seq"`   // the last
}

// ReplayStartParams are ReplayStart's.
type ReplayStartParams struct {
	Stream        string     `db:"stream"`         // the stream replayed
	Exchange      string     `db:"exchange"`       // the exchange it is replayed to
	Request       string     `db:"request"`        // the window as asked for
	WindowStart   *time.Time `db:"window_start"`   // the window's start, if by time
	WindowEnd     *time.Time `db:"window_end"`     // its end
	FromSeq       int64      `db:"from_seq"`       // the first sequence
	ToSeq         int64      `db:"to_seq"`         // the last
	StreamCreated *time.Time `db:"stream_created"` // the stream's creation time
}

// ReplayAdvanceParams are ReplayAdvance's: the counts are added to the
// run's.
type ReplayAdvanceParams struct {
	ID                int64 `db:"id"`                 // the run
	Position          int64 `db:"position"`           // done up to this sequence
	Sent              int64 `db:"sent"`               // confirmed by RabbitMQ
	SkippedDelivered  int64 `db:"skipped_delivered"`  // the delivered record says RabbitMQ has them
	SkippedBackfilled int64 `db:"skipped_backfilled"` // moved by the backfill
	SkippedOwed       int64 `db:"skipped_owed"`       // in the outbox or the owed table
	WithoutID         int64 `db:"without_id"`         // no Nats-Msg-Id
	OtherSubject      int64 `db:"other_subject"`      // not under the subject prefix
	FailedPermanent   int64 `db:"failed_permanent"`   // RabbitMQ can never take them
	Expected          int64 `db:"expected"`           // the position the run must be at
	Finish            bool  `db:"finish"`             // the run is finished
}

// LockTimeoutParams are LockTimeout's.
type LockTimeoutParams struct {
	LockTimeout string `db:"lock_timeout"` // e.g. "20ms"
}

// NotifyParams are Notify's.
type NotifyParams struct {
	Channel string `db:"channel"` // the channel the relays listen on
	Payload string `db:"payload"` // "" (rows committed), or the lowest id put back in the owed table
}

// MaxIDParams are MaxID's.
type MaxIDParams struct {
	Above int64 `db:"above"` // the highest id the relay has seen
}

// WakeLockStateParams are WakeLockState's.
type WakeLockStateParams struct {
	Above      int64  `db:"above"`       // the highest id the relay has seen
	LockClass  uint32 `db:"lock_class"`  // the wake lock key's high half
	LockObject uint32 `db:"lock_object"` // and its low half
}

// WakeDefaultParams are WakeDefault's.
type WakeDefaultParams struct {
	Table string `db:"table"` // the table's quoted identifier
}

// WakeLockParams are WakeLock's and WakeUnlock's.
type WakeLockParams struct {
	Key int64 `db:"key"` // the wake lock's key
}

// SessionSettingsParams are SessionSettings'.
type SessionSettingsParams struct {
	IdleTimeout string `db:"idle_timeout"` // idle_in_transaction_session_timeout, in ms
	JIT         string `db:"jit"`          // jit: "off" unless the URL says otherwise
}
