package cutover

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// CondNamed is the condition that every durable consumer of the groups'
// streams is a group or excluded: with AllConsumers set.
const CondNamed = "consumers named"

// namedCondition lists the durable consumers of each group's stream and
// fails on any that no group names and Exclude does not: at phase 4 one
// left out would go unchecked.
func namedCondition(ctx context.Context, cfg Config) Condition {
	c := Condition{Name: CondNamed}
	var streams []string
	named := map[[2]string]bool{}
	for _, g := range cfg.Groups {
		if !slices.Contains(streams, g.Stream) {
			streams = append(streams, g.Stream)
		}
		named[[2]string{g.Stream, g.Consumer}] = true
	}
	var unnamed, problems []string
	total := 0
	for _, s := range streams {
		st, err := cfg.JS.Stream(ctx, s)
		if err != nil {
			problems = append(problems, fmt.Sprintf("cannot list the consumers of stream %s: %v", s, err))
			continue
		}
		l := st.ListConsumers(ctx)
		for ci := range l.Info() {
			d := ci.Config.Durable
			if d == "" || slices.Contains(cfg.Exclude, d) {
				continue
			}
			total++
			if !named[[2]string{s, d}] {
				unnamed = append(unnamed, s+"/"+d)
			}
		}
		if err := l.Err(); err != nil {
			problems = append(problems, fmt.Sprintf("cannot list the consumers of stream %s: %v", s, err))
		}
	}
	switch {
	case len(problems) > 0:
		c.Detail = strings.Join(problems, "; ")
	case len(unnamed) > 0:
		c.Detail = fmt.Sprintf("durable consumers no group names: %s (name each as a group, or --exclude it)", strings.Join(unnamed, ", "))
	default:
		c.OK = true
		c.Detail = fmt.Sprintf("each of the %d durable consumers of %s is a group", total, strings.Join(streams, ", "))
		if len(cfg.Exclude) > 0 {
			c.Detail += "; excluded: " + strings.Join(cfg.Exclude, ", ")
		}
	}
	return c
}
