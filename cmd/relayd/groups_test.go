package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/cutover"
)

// A group is [STREAM/]DURABLE[:QUEUE]: the first '/' before the first ':'
// names the stream, and the queue after that ':' may hold anything.
func TestGroupSpec(t *testing.T) {
	for _, tc := range []struct {
		spec    string
		want    cutover.Group
		wantErr string
	}{
		{"billing", cutover.Group{Consumer: "billing"}, ""},
		{"billing:billing.invoices", cutover.Group{Consumer: "billing", Queue: "billing.invoices"}, ""},
		{"BILLING/billing:q", cutover.Group{Stream: "BILLING", Consumer: "billing", Queue: "q", Label: "BILLING/billing"}, ""},
		{"billing:Billing.Contracts:InvoiceCreated/q", cutover.Group{Consumer: "billing", Queue: "Billing.Contracts:InvoiceCreated/q"}, ""},
		{"billing:", cutover.Group{}, "the queue after ':' is empty"},
		{"", cutover.Group{}, "not a valid consumer name"},
		{"bill.ing", cutover.Group{}, "not a valid consumer name"},
		{"/billing", cutover.Group{}, "not a valid stream name"},
		{"BILL ING/billing", cutover.Group{}, "not a valid stream name"},
		{"A/B/c", cutover.Group{}, "not a valid consumer name"},
	} {
		var gs groupsFlag
		err := groupPath{&gs, cutover.DualRead}.Set(tc.spec)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: error %v, want %q", tc.spec, err, tc.wantErr)
			}
			continue
		}
		tc.want.Path = cutover.DualRead
		if err != nil || len(gs) != 1 || !reflect.DeepEqual(gs[0], tc.want) {
			t.Errorf("%q: %+v, %v; want %+v", tc.spec, gs, err, tc.want)
		}
	}
}

// The group flags are lists; the rest of the check's flags are not. Each
// mistake is a usage error naming it, before anything is connected.
func TestCutoverGroupFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"cutover", "check"}, "name a group: --dual-read, --rolling-upgrade or --consumer"},
		{[]string{"cutover", "check", "--queue", "q"}, "--queue goes with --consumer"},
		{[]string{"cutover", "check", "--dual-read", "a", "--dual-read", "a:q"}, "consumer a is named twice"},
		{[]string{"cutover", "check", "--dual-read", "a", "--rolling-upgrade", "a"}, "consumer a is named twice"},
		{[]string{"cutover", "check", "--consumer", "a", "--dual-read", "a"}, "consumer a is named twice"},
		{[]string{"cutover", "check", "--dual-read", "a.b"}, "not a valid consumer name"},
		{[]string{"cutover", "check", "--dual-read", "a", "--stream", "S.1"}, `--stream "S.1" is not a valid stream name`},
		{[]string{"phase", "set", "nats"}, "name the consumer groups"},
		{[]string{"phase", "set", "dual", "--dual-read", "a"}, "--dual-read is for the cutover check"},
		{[]string{"phase", "set", "nats", "--force", "--rolling-upgrade", "a:q"}, "--rolling-upgrade is for the cutover check"},
	} {
		code, out, errOut := runCLI(t, base(), tc.args...)
		if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("relayd %v: exit %d, stderr %q; want 2 and one line with %q", tc.args, code, errOut, tc.want)
		}
	}
}

// Groups that name no stream take --stream, else RELAY_NATS_STREAM; with
// neither, the group is named in the error. The same consumer on two
// streams is two groups.
func TestGroupsResolveTheirStream(t *testing.T) {
	gs := groupsFlag{{Consumer: "a", Path: cutover.DualRead}, {Stream: "OTHER", Consumer: "a", Path: cutover.DualRead}}
	got, err := gs.resolve("OUTBOX")
	if err != nil || got[0].Stream != "OUTBOX" || got[1].Stream != "OTHER" {
		t.Fatalf("resolve = %+v, %v", got, err)
	}
	if _, err := gs.resolve(""); err == nil || !strings.Contains(err.Error(), "group a names no stream") {
		t.Fatalf("resolve without a stream: %v", err)
	}
	if _, err := (groupsFlag{{Consumer: "a"}, {Stream: "OUTBOX", Consumer: "a"}}).resolve("OUTBOX"); err == nil {
		t.Fatal("the same consumer of the same stream twice: no error")
	}
}
