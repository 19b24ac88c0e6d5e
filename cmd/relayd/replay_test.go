package main

import (
	"strings"
	"testing"
)

// A bad window or rate is refused with exit 2 and one line naming the flag,
// before anything is connected.
func TestReplayFlagValues(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replay", "--since", "1h", "--from-seq", "3"}, "--since and --from-seq exclude each other"},
		{[]string{"replay", "--from-seq", "9", "--to-seq", "3"}, "--from-seq 9 is past --to-seq 3"},
		{[]string{"replay", "--rate", "0"}, "--rate 0 is out of range"},
		{[]string{"replay", "--since", "soon"}, "relayd replay: --since:"},
		{[]string{"replay", "--connect-timeout", "0s"}, "--connect-timeout must be a positive duration"},
	} {
		code, out, errOut := runCLI(t, base(), tc.args...)
		if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("relayd %v: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}
