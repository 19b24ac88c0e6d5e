package main

import (
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/backfill"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// The env tags repeat the libraries' defaults, since a tag cannot name a
// constant: each must say what the library says, so that relayd and a
// program using the library directly agree.
func TestEnvDefaultsAreTheLibraries(t *testing.T) {
	relayd := envDefaults[config]()
	for name, want := range map[string]any{
		"RELAY_OUTBOX_TABLE":    schema.DefaultTable,
		"RELAY_BATCH_SIZE":      relay.DefaultBatchSize,
		"RELAY_WORKERS":         relay.DefaultWorkers,
		"RELAY_PUBLISH_TIMEOUT": relay.DefaultPublishTimeout, // backfill's default too
		"RELAY_POLL_INTERVAL":   relay.DefaultPollInterval,
		"RELAY_RETENTION":       relay.DefaultRetention,
		"RELAY_MAX_ATTEMPTS":    relay.DefaultMaxAttempts,
		"RELAY_RETRY_MIN":       relay.DefaultRetryMin,
		"RELAY_RETRY_MAX":       relay.DefaultRetryMax,
	} {
		checkEnvDefault(t, relayd, name, want)
	}

	// backfill.Config's zero Limit and Rate mean no limit and no cap; its
	// Prefetch default is set in code (docCodeDefaults), not in a tag.
	bf := envDefaults[backfillEnv]()
	var zero backfill.Config
	checkEnvDefault(t, bf, "RELAY_BACKFILL_LIMIT", zero.Limit)
	checkEnvDefault(t, bf, "RELAY_BACKFILL_RATE", zero.Rate)
	if v, ok := bf["RELAY_BACKFILL_PREFETCH"]; ok {
		t.Errorf("RELAY_BACKFILL_PREFETCH: env tag default=%s, want none (backfill.DefaultPrefetch applies)", v)
	}
}

// envDefaults returns each variable of T that has a default= in its env
// tag, with that default.
func envDefaults[T any]() map[string]string {
	defs := map[string]string{}
	typ := reflect.TypeFor[T]()
	for i := range typ.NumField() {
		name, opts, _ := strings.Cut(typ.Field(i).Tag.Get("env"), ",")
		for _, o := range strings.Split(opts, ",") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(o), "default="); ok {
				defs[name] = v
			}
		}
	}
	return defs
}

// checkEnvDefault fails unless defs[name], parsed as want's type, is want.
func checkEnvDefault(t *testing.T, defs map[string]string, name string, want any) {
	t.Helper()
	s, ok := defs[name]
	if !ok {
		t.Errorf("%s: no default= in its env tag, want %v", name, want)
		return
	}
	var got any
	var err error
	switch want.(type) {
	case string:
		got = s
	case int:
		got, err = strconv.Atoi(s)
	case int64:
		got, err = strconv.ParseInt(s, 10, 64)
	case float64:
		got, err = strconv.ParseFloat(s, 64)
	case time.Duration:
		got, err = time.ParseDuration(s)
	default:
		t.Fatalf("%s: no parser for a %T default", name, want)
	}
	if err != nil || got != want {
		t.Errorf("%s: env tag default=%s, want the library's %v", name, s, want)
	}
}
