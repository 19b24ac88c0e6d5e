package outboxsql

import (
	"context"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/relayd/relayd/schema"
)

// paramsOf is each statement's params struct by its field path in
// Statements (nil: it has no parameters). A new statement needs an entry.
var paramsOf = map[string]any{
	"Claim": ClaimParams{}, "Recheck": RecheckParams{}, "Record": RecordParams{},
	"Late.AMQP": LateParams{}, "Late.NATS": LateParams{}, "LateWait": LateParams{}, "LateRoute": LateRouteParams{},
	"Finish":           FinishParams{},
	"CleanupDelivered": CleanupParams{}, "CleanupBackfilled": CleanupParams{},
	"Stats.AMQP.Pending": StatsParams{}, "Stats.AMQP.Parked": nil, "Stats.AMQP.LastError": StatsParams{},
	"Stats.NATS.Pending": StatsParams{}, "Stats.NATS.Parked": nil, "Stats.NATS.LastError": StatsParams{},
	"FinishedWithoutNATS": FinishedWithoutNATSParams{}, "FinishedWithoutNATSSince": FinishedWithoutNATSSinceParams{},
	"ActiveTargets": nil,
	"ListParked":    ListParkedParams{}, "ListParkedLast": ListParkedParams{},
	"RetryParked.AMQP": RetryParkedParams{}, "RetryParked.NATS": RetryParkedParams{},
	"MaxID": MaxIDParams{}, "WakeLockState": WakeLockStateParams{},
	"Horizon": nil, "TableHealth": nil,
	"Known": KnownParams{}, "RecordMoved": RecordMovedParams{}, "BackfillMoved": BackfillMovedParams{},
	"VerifyOutbox": VerifyParams{}, "VerifyBackfill": VerifyParams{},
	"PhaseRead": nil, "PhaseLock": nil, "PhaseShare": nil, "PhaseSet": PhaseSetParams{}, "PhaseHistory": nil,
	"InstanceBeat": InstanceBeatParams{}, "InstanceLeave": InstanceLeaveParams{},
	"InstancesPrune": InstancesPruneParams{}, "Instances": InstancesParams{},
	"ReplayDelivered": ReplayDeliveredParams{}, "ReplayOwed": ReplayOwedParams{}, "ReplayBackfilled": ReplayBackfilledParams{},
	"ReplayStranded": ReplayStrandedParams{},
	"ReplayClaims":   nil, "ReplayClaimsLeft": ReplayClaimsLeftParams{},
	"ReplayRecordStart": nil,
	"ReplayLock":        nil, "ReplayUnlock": nil,
	"ReplayRun": ReplayRunParams{}, "ReplayUnfinished": nil, "ReplayOverlap": ReplayOverlapParams{},
	"ReplayLatest":  nil,
	"ReplayStart":   ReplayStartParams{},
	"ReplayAdvance": ReplayAdvanceParams{}, "ReplayAbandon": nil,
}

// paramsOfVerify is paramsOf for VerifyRun's statements.
var paramsOfVerify = map[string]any{
	"Create": nil, "Drop": nil, "FillOutbox": VerifyParams{}, "FillBackfill": VerifyParams{},
	"Index": nil, "Duplicates": nil, "DuplicateExamples": ExamplesParams{},
	"Outbox.Missing": nil, "Outbox.MissingExamples": ExamplesParams{}, "Outbox.Duplicated": nil, "Outbox.DuplicatedExamples": ExamplesParams{},
	"Backfill.Missing": nil, "Backfill.MissingExamples": ExamplesParams{}, "Backfill.Duplicated": nil, "Backfill.DuplicatedExamples": ExamplesParams{},
}

// The SQL-to-Go contract, checked without a database: the named parameters
// of each statement are exactly its params struct's db tags, pgx accepts
// the struct for the statement (pgx.StrictStructArgs), and no statement
// has a positional parameter but the one known exception.
func TestParamsMatchStatements(t *testing.T) {
	t.Parallel()
	table := schema.MustParseTable("s1.box")
	check := func(name, sql string, params any, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("%s: no params struct listed for it (paramsOf)", name)
			return
		}
		_, names := Positional(sql)
		slices.Sort(names)
		var tags []string
		if params != nil {
			typ := reflect.TypeOf(params)
			for i := range typ.NumField() {
				tag, ok := typ.Field(i).Tag.Lookup("db")
				if !ok || tag == "" {
					t.Errorf("%s: %s.%s has no db tag", name, typ.Name(), typ.Field(i).Name)
				}
				tags = append(tags, tag)
			}
			if _, _, err := pgx.StrictStructArgs(params).RewriteQuery(context.Background(), nil, sql, nil); err != nil {
				t.Errorf("%s: pgx refuses %T: %v", name, params, err)
			}
		}
		slices.Sort(tags)
		if !slices.Equal(names, tags) {
			t.Errorf("%s: the SQL names %v, its params struct %T %v", name, names, params, tags)
		}
		if positionalParam.MatchString(sql) {
			t.Errorf("%s has a positional parameter:\n%s", name, sql)
		}
	}
	named := For(table).named()
	for name, sql := range named {
		p, ok := paramsOf[name]
		check(name, sql, p, ok)
	}
	for name := range paramsOf {
		if _, ok := named[name]; !ok {
			t.Errorf("paramsOf lists %s, which is no statement", name)
		}
	}
	v := reflect.ValueOf(VerifyFor(table)).Elem()
	seen := 0
	var walk func(path string, v reflect.Value)
	walk = func(path string, v reflect.Value) {
		switch v.Kind() {
		case reflect.String:
			seen++
			p, ok := paramsOfVerify[path]
			check("VerifyRun."+path, v.String(), p, ok)
		case reflect.Struct:
			for i := range v.NumField() {
				walk(strings.TrimPrefix(path+"."+v.Type().Field(i).Name, "."), v.Field(i))
			}
		}
	}
	walk("", v)
	if seen != len(paramsOfVerify) {
		t.Errorf("VerifyRun has %d statements, paramsOfVerify lists %d", seen, len(paramsOfVerify))
	}
	for _, c := range []struct {
		name, sql string
		params    any
	}{
		{"LockTimeout", LockTimeout, LockTimeoutParams{}},
		{"Notify", Notify, NotifyParams{}},
		{"WakeDefault", WakeDefault, WakeDefaultParams{}},
		{"WakeLock", WakeLock, WakeLockParams{}},
		{"WakeUnlock", WakeUnlock, WakeLockParams{}},
		{"SessionSettings", SessionSettings, SessionSettingsParams{}},
	} {
		check(c.name, c.sql, c.params, true)
	}
}

// Positional numbers the names as pgx does, in the order they first appear.
func TestPositional(t *testing.T) {
	t.Parallel()
	got, names := Positional(`SELECT @b::int, '@x', @a, @b -- @c`)
	if got != `SELECT $1::int, '@x', $2, $1 -- @c` || !slices.Equal(names, []string{"b", "a"}) {
		t.Errorf("Positional: %q %v", got, names)
	}
	for name, sql := range For(schema.MustParseTable("outbox")).All() {
		if strings.Contains(sql, "@") {
			t.Errorf("All()'s %s keeps a named parameter", name)
		}
	}
}
