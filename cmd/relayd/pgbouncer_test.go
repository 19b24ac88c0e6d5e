package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/testenv"
)

// relayd needs a session of its own. PgBouncer refuses its session
// settings in any pool mode unless told to ignore them, and the refusal
// says why and what works, at once. In session mode ignoring them, relayd
// sets them itself after connecting.
func TestPgBouncer(t *testing.T) {
	if testing.Short() {
		t.Skip("needs Postgres and pgbouncer")
	}
	t.Parallel()
	for _, tc := range []struct {
		name    string
		mode    string
		ignore  []string
		wantErr []string // "": connects
	}{
		{"transaction pooling", "transaction", nil,
			[]string{"unsupported startup parameter", "needs a session of its own", "transaction and statement pooling cannot work"}},
		{"session pooling, the settings refused", "session", nil,
			[]string{"unsupported startup parameter", "ignore_startup_parameters = idle_in_transaction_session_timeout, jit"}},
		{"session pooling, the settings ignored", "session", []string{"idle_in_transaction_session_timeout", "jit"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := &config{DatabaseURL: testenv.PgBouncer(t, tc.mode, tc.ignore...), PublishTimeout: 10 * time.Second, StartupTimeout: 20 * time.Second}
			start := time.Now()
			pool, err := newPool(context.Background(), cfg, 2)
			if len(tc.wantErr) > 0 {
				if err == nil {
					pool.Close()
					t.Fatal("connected")
				}
				for _, want := range tc.wantErr {
					if !strings.Contains(err.Error(), want) {
						t.Errorf("error %q does not say %q", err, want)
					}
				}
				if took := time.Since(start); took > 5*time.Second {
					t.Errorf("refused after %v, want at once", took)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer pool.Close()
			for setting, want := range map[string]string{"idle_in_transaction_session_timeout": "50s", "jit": "off"} {
				var got string
				if err := pool.QueryRow(context.Background(), "SHOW "+setting).Scan(&got); err != nil {
					t.Fatal(err)
				}
				if got != want {
					t.Errorf("%s = %s through session pooling, want %s", setting, got, want)
				}
			}
		})
	}
}
