// Package outboxsql owns the SQL that relayd runs against the outbox table
// and its side tables (delivered, backfilled), so a statement is read whole,
// in one place, and the predicates the indexes are built on are written
// once.
//
// The statements are text/template files in sql/, rendered once per table:
// only the table identifiers (validated and quoted by package schema) and
// the record's Outcome codes are template fields; every value is a bind
// parameter, named (@name): a statement's parameters are the db tags of its
// params struct (params.go), which callers pass as pgx.StrictStructArgs.
package outboxsql

import (
	"context"
	"embed"
	"fmt"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"text/template"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/schema"
)

// ExactLimit is how many pending rows the stats count one by one; beyond it
// the count is estimated, so reading stats stays cheap with millions of rows
// pending.
const ExactLimit = 10000

// ActiveWindow is how many rows of the outbox's head, and of the newest of
// its delivered record, ActiveTargets looks at: enough to see what the relays
// serve, few enough to stay cheap on a large table.
const ActiveWindow = 1000

// OnIndexes keeps the transaction's plans generic and on the tables'
// indexes, in their order, however stale the planner's statistics are
// (docs/design.md, "Plans"). Do not modify.
const OnIndexes = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true), " +
	"set_config('enable_seqscan', 'off', true), set_config('enable_sort', 'off', true)"

// BatchBegin opens a batch's transaction with OnIndexes. It goes out in the
// claim's round trip.
var BatchBegin = []string{"BEGIN", OnIndexes}

// EmptyCommit ends a claim that took no rows. It wrote only its
// transaction id (Claim takes one), so its commit does not wait for a WAL
// flush, which the producers' commits queue for too. Do not modify.
const EmptyCommit = "SET LOCAL synchronous_commit = off; COMMIT"

// ReadBegin opens a read-only transaction whose statements stay on the
// tables' indexes however stale the planner's statistics are. Do not modify.
var ReadBegin = []string{"BEGIN READ ONLY", "SET LOCAL enable_seqscan = off"}

// LockTimeout sets the transaction's lock_timeout (LockTimeoutParams).
const LockTimeout = `SELECT set_config('lock_timeout', @lock_timeout, true)`

// Notify wakes the idle relays listening on a channel (NotifyParams). A
// payload is the lowest id of rows put back in the owed table (RetryParked)
// or moved there late (Late): the relays' owed floors go back to it.
const Notify = `SELECT pg_notify(@channel, @payload)`

// WakeDefault reads created_at's default in the table @table (its quoted
// identifier), as Postgres prints it, where migration 00016 keeps the
// wake-up's channel and lock: no row for a missing table.
const WakeDefault = `SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d
	JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum
	WHERE d.adrelid = to_regclass(@table) AND a.attname = 'created_at'`

// Listen is the LISTEN of a relay's listener on channel, which Postgres
// takes as an identifier, not a parameter.
func Listen(channel string) string { return "LISTEN " + pgx.Identifier{channel}.Sanitize() }

// WakeLockHolder is a query for the pid of the session holding the wake
// lock key exclusively (schema.Table.WakeLock): the relay waiting for rows,
// if any. Tests and the benchmark wait on it.
func WakeLockHolder(key int64) string {
	return fmt.Sprintf(`SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND mode = 'ExclusiveLock' AND granted
	AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	AND classid = %d AND objid = %d AND objsubid = 1`, uint64(key)>>32, uint32(key))
}

// SessionSettings sets again, on each new connection, what relayd asks of
// its sessions as startup parameters, which a pooler may drop
// (SessionSettingsParams).
const SessionSettings = `SELECT set_config('idle_in_transaction_session_timeout', @idle_timeout, false), set_config('jit', @jit, false)`

// WakeLock waits for the wake lock @key, as long as the transaction's
// lock_timeout; WakeTryLock takes it only if no one holds it, without
// queueing; WakeUnlock releases it.
const (
	WakeLock    = `SELECT pg_advisory_lock(@key)`
	WakeTryLock = `SELECT pg_try_advisory_lock(@key)`
	WakeUnlock  = `SELECT pg_advisory_unlock(@key)`
)

// Statements is the SQL for one outbox table. Each is documented beside it
// in sql/, and its parameters by its params struct (params.go).
type Statements struct {
	// The relay's batch (store.go).
	Claim   string
	Recheck string // a claim of the rows below the floor that other batches held
	Record  string
	Late    ByTarget[string] // confirms that came after their batch gave up
	// LateWait goes before Late, in its transaction; LateRoute after it.
	LateWait  string
	LateRoute string
	// Finish moves out rows JetStream has that no batch will (nats-only),
	// after PhaseShare in its transaction.
	Finish string

	// Retention.
	CleanupDelivered  string
	CleanupBackfilled string

	// Backlog figures and the operator's commands.
	Stats                    ByTarget[Stats]
	FinishedWithoutNATS      string
	FinishedWithoutNATSSince string
	ActiveTargets            string
	ListParked               string
	ListParkedLast           string
	RetryParked              ByTarget[string]
	MaxID                    string
	WakeLockState            string

	// What holds back VACUUM's horizon, and what relayd's tables hold.
	Horizon, TableHealth string

	// The backfill's lookups and record.
	Known       string
	RecordMoved string
	// What a backfill moved lately, for relayd run's console.
	BackfillMoved string

	// Verify's reads of the ledgers (SELECTs of msg_id, at).
	VerifyOutbox   string
	VerifyBackfill string

	// The shared phase and the running relays (package phase).
	PhaseRead, PhaseLock, PhaseShare, PhaseSet, PhaseHistory string
	InstanceBeat, InstanceLeave, InstancesPrune, Instances   string

	// `relayd replay`: what RabbitMQ has, and the run's record (package
	// replay).
	ReplayDelivered, ReplayOwed, ReplayBackfilled string
	ReplayStranded                                string
	ReplayClaims, ReplayClaimsLeft                string
	ReplayRecordStart                             string
	ReplayLock, ReplayUnlock                      string
	ReplayRun, ReplayUnfinished, ReplayOverlap    string
	ReplayLatest                                  string
	ReplayStart                                   string
	ReplayAdvance, ReplayAbandon                  string
}

// Stats is the SQL for one target's backlog figures, in the order
// relay.ReadStats runs them.
type Stats struct {
	Pending   string
	Parked    string
	LastError string
}

// ByTarget holds one value per target.
type ByTarget[T any] struct{ AMQP, NATS T }

// Get returns the value for the target whose column prefix is p ("amqp" or
// "nats"); it panics on any other.
func (b ByTarget[T]) Get(p string) T {
	switch p {
	case "amqp":
		return b.AMQP
	case "nats":
		return b.NATS
	}
	panic("outboxsql: unknown target " + p)
}

//go:embed sql/*.sql
var files embed.FS

var templates = template.Must(template.New("").Funcs(template.FuncMap{
	"below": func(walk, limit string) *bound { return &bound{Walk: walk, Limit: limit} },
}).ParseFS(files, "sql/*.sql"))

var cache sync.Map // schema.Table → *Statements

// For returns the statements for table t, rendered on first use.
func For(t schema.Table) *Statements {
	if s, ok := cache.Load(t); ok {
		return s.(*Statements)
	}
	s, _ := cache.LoadOrStore(t, render(t))
	return s.(*Statements)
}

// dataFor is what table t's statements see.
func dataFor(t schema.Table) tableData {
	return tableData{
		Table: t.Ident(), Owed: t.Owed(), Delivered: t.Delivered(), Backfilled: t.Backfilled(),
		Phase: t.Side("phase"), PhaseHistory: t.Side("phase_history"), Instances: t.Side("instances"),
		Replay:     t.Side("replay"),
		ExactLimit: ExactLimit, ActiveWindow: ActiveWindow, Outcome: outcomes,
	}
}

func render(t schema.Table) *Statements {
	d := dataFor(t)
	perTarget := func(name string) ByTarget[string] {
		return ByTarget[string]{AMQP: exec(name, d.AMQP()), NATS: exec(name, d.NATS())}
	}
	stats := func(p string) Stats {
		td := d.Target(p)
		return Stats{Pending: exec("StatsPending", td), Parked: exec("StatsParked", td), LastError: exec("StatsLastError", td)}
	}
	return &Statements{
		Claim:                    exec("Claim", d),
		Recheck:                  exec("Recheck", d),
		Record:                   exec("Record", d),
		Late:                     perTarget("Late"),
		LateWait:                 exec("LateWait", d),
		LateRoute:                exec("LateRoute", d),
		Finish:                   exec("Finish", d),
		CleanupDelivered:         exec("CleanupDelivered", d),
		CleanupBackfilled:        exec("CleanupBackfilled", d),
		Stats:                    ByTarget[Stats]{AMQP: stats("amqp"), NATS: stats("nats")},
		FinishedWithoutNATS:      exec("FinishedWithoutNATS", d),
		FinishedWithoutNATSSince: exec("FinishedWithoutNATSSince", d),
		ActiveTargets:            exec("ActiveTargets", d),
		ListParked:               exec("ListParked", d),
		ListParkedLast:           exec("ListParkedLast", d),
		RetryParked:              perTarget("RetryParked"),
		MaxID:                    exec("MaxID", d),
		WakeLockState:            exec("WakeLockState", d),
		Horizon:                  exec("Horizon", d),
		TableHealth:              exec("TableHealth", d),
		Known:                    exec("Known", d),
		RecordMoved:              exec("RecordMoved", d),
		BackfillMoved:            exec("BackfillMoved", d),
		VerifyOutbox:             exec("VerifyOutbox", d),
		VerifyBackfill:           exec("VerifyBackfill", d),
		PhaseRead:                exec("PhaseRead", d),
		PhaseLock:                exec("PhaseLock", d),
		PhaseShare:               exec("PhaseShare", d),
		PhaseSet:                 exec("PhaseSet", d),
		PhaseHistory:             exec("PhaseHistory", d),
		InstanceBeat:             exec("InstanceBeat", d),
		InstanceLeave:            exec("InstanceLeave", d),
		InstancesPrune:           exec("InstancesPrune", d),
		Instances:                exec("Instances", d),
		ReplayDelivered:          exec("ReplayDelivered", d),
		ReplayOwed:               exec("ReplayOwed", d),
		ReplayBackfilled:         exec("ReplayBackfilled", d),
		ReplayStranded:           exec("ReplayStranded", d),
		ReplayClaims:             exec("ReplayClaims", d),
		ReplayClaimsLeft:         exec("ReplayClaimsLeft", d),
		ReplayRecordStart:        exec("ReplayRecordStart", d),
		ReplayLock:               exec("ReplayLock", d),
		ReplayUnlock:             exec("ReplayUnlock", d),
		ReplayRun:                exec("ReplayRun", d),
		ReplayUnfinished:         exec("ReplayUnfinished", d),
		ReplayOverlap:            exec("ReplayOverlap", d),
		ReplayLatest:             exec("ReplayLatest", d),
		ReplayStart:              exec("ReplayStart", d),
		ReplayAdvance:            exec("ReplayAdvance", d),
		ReplayAbandon:            exec("ReplayAbandon", d),
	}
}

// exec renders one named statement. The templates and their data are fixed,
// so an error is a bug the package's tests catch.
func exec(name string, data any) string {
	var b strings.Builder
	if err := templates.ExecuteTemplate(&b, name, data); err != nil {
		panic("outboxsql: " + err.Error())
	}
	return strings.TrimSpace(b.String())
}

// tableData is what every statement sees: the quoted identifiers. Table is
// the producers' table, which holds rows no batch has recorded anything of
// yet ("fresh": owed to every target); Owed the rows a batch left owed.
type tableData struct {
	Table, Owed, Delivered, Backfilled string
	Phase, PhaseHistory, Instances     string
	Replay                             string
	ExactLimit, ActiveWindow           int
	Outcome                            outcomeCodes // the record's outcome codes
}

// Target is d for one target, p its column prefix.
func (d tableData) Target(p string) targetData {
	enabled := "@amqp_active::boolean"
	if p == "nats" {
		enabled = "@nats_active::boolean"
	}
	return targetData{tableData: d, P: p, Enabled: enabled}
}

// AMQP and NATS are d for the RabbitMQ and the JetStream target.
func (d tableData) AMQP() targetData { return d.Target("amqp") }
func (d tableData) NATS() targetData { return d.Target("nats") }

// targetData is what a per-target statement or predicate sees.
type targetData struct {
	tableData
	P       string // the target's column prefix
	Enabled string // the claim's parameter saying whether it is active
	Bound   *bound // for a claim walk bounded by another (see "below")
	Row     string // the row a per-row predicate is about (see "keyFree")
	Key     string // NULL or NOT NULL: the rows a probe is about (see "lowestOwed")...
	Floor   string // ...above this parameter
}

// Of is d for a predicate about row, a table or an alias.
func (d targetData) Of(row string) targetData {
	d.Row = row
	return d
}

// Below is d for a claim walk that stays below walk when it took limit rows.
func (d targetData) Below(walk, limit string) targetData {
	d.Bound = &bound{Walk: walk, Limit: limit}
	return d
}

// First is d for the first n rows owed to the target, with columns cols of
// the owed table, and fresh of the outbox.
func (d targetData) First(cols, fresh string, n int) pending {
	return pending{targetData: d, Cols: cols, Fresh: fresh, N: n}
}

// Above is d for a probe of the rows whose key IS key (NULL or NOT NULL)
// above parameter floor.
func (d targetData) Above(key, floor string) targetData {
	d.Key, d.Floor = key, floor
	return d
}

type bound struct{ Walk, Limit string }

type pending struct {
	targetData
	Cols, Fresh string
	N           int
}

// All is every statement in s by its field path ("Stats.AMQP.Pending"),
// its parameters numbered as pgx sends them (Positional), so that PREPARE
// takes it: checks that must cover each one (plans, privileges) take a new
// one without listing it.
func (s *Statements) All() map[string]string {
	out := map[string]string{}
	for path, q := range s.named() {
		out[path], _ = Positional(q)
	}
	return out
}

// named is every statement in s by its field path, as written.
func (s *Statements) named() map[string]string {
	out := map[string]string{}
	var walk func(path string, v reflect.Value)
	walk = func(path string, v reflect.Value) {
		switch v.Kind() {
		case reflect.String:
			out[path] = v.String()
		case reflect.Struct:
			for i := range v.NumField() {
				walk(strings.TrimPrefix(path+"."+v.Type().Field(i).Name, "."), v.Field(i))
			}
		}
	}
	walk("", reflect.ValueOf(s).Elem())
	return out
}

// namedParam is a named parameter, as pgx reads one: @ and an identifier.
var namedParam = regexp.MustCompile(`@([A-Za-z_][A-Za-z0-9_]*)`)

// positionalParam is a positional parameter ($1).
var positionalParam = regexp.MustCompile(`\$[0-9]`)

// Positional is sql as pgx sends it: each named parameter replaced by $n,
// numbered in the order the names first appear; names[n-1] is the name of
// $n. It is for checks that PREPARE or EXPLAIN a statement; callers pass
// the params struct (pgx.StrictStructArgs), and pgx numbers them so.
func Positional(sql string) (positional string, names []string) {
	// Every candidate name, its own value; pgx's lexer then numbers those
	// it reads as parameters (not in quoted text or comments), and returns
	// their values in that order.
	args := pgx.NamedArgs{}
	for _, m := range namedParam.FindAllStringSubmatch(sql, -1) {
		args[m[1]] = m[1]
	}
	positional, values, err := args.RewriteQuery(context.Background(), nil, sql, nil)
	if err != nil {
		panic("outboxsql: " + err.Error())
	}
	names = make([]string, len(values))
	for i, v := range values {
		names[i] = v.(string)
	}
	return positional, names
}

// VerifyStream is the temporary table a verify run copies the stream's
// pairs into (in pg_temp; VerifyRun).
const VerifyStream = "relayd_verify_stream"

// VerifyRun is the SQL of one `relayd verify` run on one table: temporary
// tables in the session of the one connection the run holds, so they are
// not among Statements (nothing else could prepare them). See sql/verify.sql.
type VerifyRun struct {
	Create, Drop string
	// The ledgers' pairs into the run's tables (VerifyParams).
	FillOutbox, FillBackfill string
	// After the scan: Index, then the stream's duplicates (the examples:
	// ExamplesParams), then each ledger's checks.
	Index                         string
	Duplicates, DuplicateExamples string
	Outbox, Backfill              VerifyLedger
}

// VerifyLedger is a verify run's checks of one ledger against the stream;
// the examples take ExamplesParams.
type VerifyLedger struct {
	Missing, MissingExamples       string
	Duplicated, DuplicatedExamples string
}

// VerifyMaxSeqs bounds the sequences a verify run lists for one duplicated
// id.
const VerifyMaxSeqs = 20

var verifyCache sync.Map // schema.Table → *VerifyRun

// VerifyFor returns a verify run's statements for table t.
func VerifyFor(t schema.Table) *VerifyRun {
	if v, ok := verifyCache.Load(t); ok {
		return v.(*VerifyRun)
	}
	v, _ := verifyCache.LoadOrStore(t, renderVerify(t))
	return v.(*VerifyRun)
}

// verifyData is what a verify run's statements see: the table's, and the
// run's temporary tables.
type verifyData struct {
	tableData
	Stream, Outbox, Backfill, Dups string
	MaxSeqs                        int
	Ledger                         string // the ledger a check reads
}

func renderVerify(t schema.Table) *VerifyRun {
	d := verifyData{
		tableData: dataFor(t),
		Stream:    "pg_temp." + VerifyStream, Outbox: "pg_temp.relayd_verify_outbox",
		Backfill: "pg_temp.relayd_verify_backfill", Dups: "pg_temp.relayd_verify_dups",
		MaxSeqs: VerifyMaxSeqs,
	}
	ledger := func(name string) VerifyLedger {
		l := d
		l.Ledger = name
		return VerifyLedger{
			Missing: exec("VerifyMissing", l), MissingExamples: exec("VerifyMissingExamples", l),
			Duplicated: exec("VerifyDuplicated", l), DuplicatedExamples: exec("VerifyDuplicatedExamples", l),
		}
	}
	return &VerifyRun{
		Create: exec("VerifyCreate", d), Drop: exec("VerifyDrop", d),
		FillOutbox: exec("VerifyFillOutbox", d), FillBackfill: exec("VerifyFillBackfill", d),
		Index:      exec("VerifyIndex", d),
		Duplicates: exec("VerifyDuplicates", d), DuplicateExamples: exec("VerifyDuplicateExamples", d),
		Outbox: ledger(d.Outbox), Backfill: ledger(d.Backfill),
	}
}
