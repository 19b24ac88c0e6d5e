package main

import (
	"strings"
	"testing"

	"github.com/sethvargo/go-envconfig"
)

// Unset or empty: one P. A whole number: the runtime already applied it
// (0: leave it). Anything else: a config error naming GOMAXPROCS, where the
// runtime alone would ignore it without a word.
func TestProcs(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want int
		bad  bool
	}{
		{map[string]string{}, 1, false},
		{map[string]string{"GOMAXPROCS": ""}, 1, false},
		{map[string]string{"GOMAXPROCS": "4"}, 0, false},
		{map[string]string{"GOMAXPROCS": "1"}, 0, false},
		{map[string]string{"GOMAXPROCS": "0"}, 0, true},
		{map[string]string{"GOMAXPROCS": "+2"}, 0, true}, // strconv takes the sign, the runtime does not
		{map[string]string{"GOMAXPROCS": "-2"}, 0, true},
		{map[string]string{"GOMAXPROCS": "two"}, 0, true},
		{map[string]string{"GOMAXPROCS": "1.5"}, 0, true},
		// The runtime reads base 10 into 32 bits, spaces and all: these it
		// would ignore, and relayd run on every core.
		{map[string]string{"GOMAXPROCS": " 2"}, 0, true},
		{map[string]string{"GOMAXPROCS": "3000000000"}, 0, true},
		{map[string]string{"GOMAXPROCS": "010x"}, 0, true},
	} {
		n, err := procs(envconfig.MapLookuper(tc.env))
		if tc.bad {
			if err == nil || !strings.HasPrefix(err.Error(), "GOMAXPROCS: ") || strings.Contains(err.Error(), "\n") {
				t.Errorf("%v: error %v, want one line starting with GOMAXPROCS", tc.env, err)
			}
			continue
		}
		if err != nil || n != tc.want {
			t.Errorf("%v: got %d, %v; want %d", tc.env, n, err, tc.want)
		}
	}
}
