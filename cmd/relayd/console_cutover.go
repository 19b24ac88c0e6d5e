package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/relayd/relayd/internal/cutover"
)

// consolePaths are the paths RELAY_CONSOLE_CUTOVER names, as cutover check's
// flags.
var consolePaths = map[string]cutover.Path{"dual-read": cutover.DualRead, "rolling-upgrade": cutover.RollingUpgrade}

// parseConsoleGroups reads RELAY_CONSOLE_CUTOVER: groups separated by
// spaces, each PATH=GROUP as cutover check takes --PATH GROUP (dual-read or
// rolling-upgrade; GROUP [STREAM/]DURABLE[:QUEUE]). A group that names no
// stream reads stream, RELAY_NATS_STREAM.
func parseConsoleGroups(spec, stream string) ([]cutover.Group, error) {
	var gs groupsFlag
	for item := range strings.FieldsSeq(spec) {
		name, group, _ := strings.Cut(item, "=")
		path, ok := consolePaths[name]
		if !ok {
			return nil, fmt.Errorf("%q: want dual-read=GROUP or rolling-upgrade=GROUP, GROUP as [STREAM/]DURABLE[:QUEUE], separated by spaces", item)
		}
		if err := (groupPath{&gs, path}).Set(group); err != nil {
			return nil, err
		}
	}
	if err := gs.unique(); err != nil {
		return nil, err
	}
	for _, g := range gs {
		if g.Stream == "" && stream == "" {
			return nil, fmt.Errorf("group %s names no stream, and RELAY_NATS_STREAM is empty: give it as STREAM/%s", g.Consumer, g.Consumer)
		}
	}
	return gs.resolve(stream)
}

// validateConsole checks RELAY_CONSOLE_CUTOVER and what its check needs:
// NATS, and RabbitMQ for a group with a queue, whatever RELAY_TARGETS.
func (c *config) validateConsole() error {
	if !c.Console || c.ConsoleCutover == "" {
		return nil
	}
	groups, err := parseConsoleGroups(c.ConsoleCutover, c.NATSStream)
	if err != nil {
		return badVar("RELAY_CONSOLE_CUTOVER", "%v", err)
	}
	if err := checkNATSURL(c.NATSURL); err != nil {
		return badVar("RELAY_NATS_URL", "%v (RELAY_CONSOLE_CUTOVER's check reads JetStream)", err)
	}
	if groupsFlag(groups).withQueue() {
		if err := checkAMQPURL(c.AMQPURL); err != nil {
			return badVar("RELAY_AMQP_URL", "%v (RELAY_CONSOLE_CUTOVER's check reads the legacy queues)", err)
		}
	}
	c.consoleGroups = groups
	return nil
}

// consoleCutoverTimeout bounds one check from the console: a rolling
// upgrade's quiet interval is its consumer's AckWait or last BackOff step.
// The check ends sooner when nobody waits for it any more (sharedRead).
const consoleCutoverTimeout = 10 * time.Minute

// consoleConnectTimeout is how long the console's check waits for NATS.
const consoleConnectTimeout = 5 * time.Second

// consoleCutover returns the check of RELAY_CONSOLE_CUTOVER's groups. Each
// check connects to NATS for itself, and closes the connection after: the
// relay's may be down, or off (RELAY_TARGETS=amqp). While it watches, it
// samples Postgres and the brokers every RELAY_STATS_INTERVAL.
func consoleCutover(cfg *config, pool *pgxpool.Pool) func(context.Context) (cutover.Result, error) {
	return func(ctx context.Context) (cutover.Result, error) {
		tlsCfg, err := cfg.amqpTLS()
		if err != nil {
			return cutover.Result{}, err
		}
		c := *cfg
		c.StartupTimeout = consoleConnectTimeout
		quiet := slog.New(slog.DiscardHandler)
		nc, err := dialNATS(ctx, &c, quiet, quiet)
		if err != nil {
			return cutover.Result{}, errors.New(natsFailure(&c, err))
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return cutover.Result{}, fmt.Errorf("nats: jetstream: %w", err)
		}
		return cutover.Check(ctx, consoleCutoverConfig(cfg, pool, js, tlsCfg))
	}
}

func consoleCutoverConfig(cfg *config, pool *pgxpool.Pool, js jetstream.JetStream, tlsCfg *tls.Config) cutover.Config {
	return cutover.Config{
		DB: pool, Table: cfg.table, JS: js, Groups: cfg.consoleGroups,
		AMQPURL: cfg.AMQPURL, AMQPTLS: tlsCfg, Poll: cfg.StatsInterval,
	}
}

// checkVersions is the check, with the versions the relays report in the
// outbox (the page's read) as a condition: the console knows no relay's
// address to ask, as cutover check --instances does.
func (c *console) checkVersions(ctx context.Context) (cutover.Result, error) {
	res, err := c.cfg.Check(ctx)
	if err != nil {
		return res, err
	}
	data, _, err := c.page.get(ctx)
	if err != nil {
		return cutover.Result{}, err
	}
	cond := relayVersions(data)
	// After the outbox's conditions, before the groups'.
	i := slices.IndexFunc(res.Conditions, func(c cutover.Condition) bool { return c.Group != "" })
	if i < 0 {
		i = len(res.Conditions)
	}
	res.Conditions = slices.Insert(slices.Clone(res.Conditions), i, cond)
	res.OK = res.OK && cond.OK
	return res, nil
}

// relayVersions holds when every running relay reports one version; its
// detail names each version and its relays (host:pid).
func relayVersions(d pageData) cutover.Condition {
	c := cutover.Condition{Name: cutover.CondInstances}
	switch {
	case d.errs["phase"] != nil:
		c.Detail = "could not read the relays' reports: " + d.errs["phase"].Error()
		return c
	case len(d.phase.Relays) == 0:
		c.Detail = "no relay reports itself"
		return c
	}
	on := map[string][]string{}
	for _, r := range d.phase.Relays {
		v := cmp.Or(r.Version, "no version")
		on[v] = append(on[v], r.Instance.Instance)
	}
	var parts []string
	for _, v := range slices.Sorted(maps.Keys(on)) {
		parts = append(parts, v+" on "+strings.Join(on[v], ", "))
	}
	c.OK, c.Detail = len(on) == 1 && d.phase.Relays[0].Version != "", strings.Join(parts, "; ")
	return c
}

// cutoverView is the /cutover page.
type cutoverView struct {
	Generated  string
	HowTo      string // no group configured: how to
	Err        string
	OK         bool
	Verdict    string
	Conditions []conditionView
	Checked    string
}

type conditionView struct {
	OK                  bool
	Name, Group, Detail string
}

// buildCutoverView lays out the check's result, which ended at checked.
func buildCutoverView(now, checked time.Time, groups []cutover.Group, res cutover.Result, err error) cutoverView {
	v := cutoverView{Generated: timeText(now)}
	switch {
	case len(groups) == 0:
		v.HowTo = consoleCutoverHowTo
		return v
	case err != nil:
		v.Err = scrub(err.Error())
		return v
	}
	v.OK, v.Checked = res.OK, "Checked at "+timeText(checked)+"."
	failed := res.Failed()
	for _, c := range res.Conditions {
		detail := scrub(c.Detail)
		if !c.OK && !slices.Contains(failed, c) {
			detail = "not checked, another condition failed first: " + detail
		}
		v.Conditions = append(v.Conditions, conditionView{OK: c.OK, Name: c.Name, Group: c.Group, Detail: detail})
	}
	if res.OK {
		v.Verdict = "Ready: " + groupList(res.Groups) + " may read JetStream only."
	} else {
		v.Verdict = fmt.Sprintf("Not ready: %d of %d conditions do not hold.", len(failed), len(res.Conditions))
	}
	return v
}
