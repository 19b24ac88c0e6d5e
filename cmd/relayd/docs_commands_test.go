package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// docCommand is a relayd command line the docs quote, and where.
type docCommand struct {
	where string
	args  []string
}

// docCommands finds the relayd command lines in README.md and docs/*.md:
// in code spans and in code blocks, after an optional "$ ".
func docCommands(t *testing.T) []docCommand {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(docRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(docRoot, "README.md"))
	span := regexp.MustCompile("`(relayd [^`]+)`")
	var out []docCommand
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inBlock := false
		for i, line := range strings.Split(string(b), "\n") {
			where := filepath.Base(f) + ":" + strconv.Itoa(i+1)
			if strings.HasPrefix(strings.TrimSpace(line), "```") {
				inBlock = !inBlock
				continue
			}
			var cmds []string
			if inBlock {
				if l := strings.TrimPrefix(strings.TrimSpace(line), "$ "); strings.HasPrefix(l, "relayd ") {
					cmds = append(cmds, strings.SplitN(l, "#", 2)[0])
				}
			} else {
				for _, m := range span.FindAllStringSubmatch(line, -1) {
					cmds = append(cmds, m[1])
				}
			}
			for _, c := range cmds {
				out = append(out, docCommand{where, strings.Fields(c)[1:]})
			}
		}
	}
	return out
}

// Every relayd command the docs quote names a command (and action) relayd
// has, and only flags that command's --help lists: the docs cannot teach a
// flag that is gone or belongs to another command.
func TestDocCommandsUseTheirCommandsFlags(t *testing.T) {
	flagRE := regexp.MustCompile(`(?m)^  --([a-z0-9-]+)`)
	flagName := regexp.MustCompile(`^[a-z][a-z0-9-]*$`)
	helpFlags := map[string]map[string]bool{}
	flagsOf := func(cmd []string) (map[string]bool, bool) {
		key := strings.Join(cmd, " ")
		if f, ok := helpFlags[key]; ok {
			return f, f != nil
		}
		code, out, _ := runCLI(t, base(), append(append([]string(nil), cmd...), "--help")...)
		if code != exitOK {
			helpFlags[key] = nil
			return nil, false
		}
		f := map[string]bool{"help": true}
		for _, m := range flagRE.FindAllStringSubmatch(out, -1) {
			f[m[1]] = true
		}
		helpFlags[key] = f
		return f, true
	}
	n := 0
	for _, dc := range docCommands(t) {
		if len(dc.args) == 0 || strings.HasPrefix(dc.args[0], "-") || strings.ContainsAny(dc.args[0], "<[|…") || dc.args[0] == "COMMAND" {
			continue
		}
		cmd := dc.args[:1]
		rest := dc.args[1:]
		// The action, when the command has one: the longest prefix whose help
		// exists.
		if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
			if _, ok := flagsOf(append(cmd[:1:1], rest[0])); ok {
				cmd, rest = append(cmd[:1:1], rest[0]), rest[1:]
			}
		}
		flags, ok := flagsOf(cmd)
		if !ok {
			t.Errorf("%s: relayd %s: no such command (its --help fails)", dc.where, strings.Join(dc.args, " "))
			continue
		}
		for _, a := range rest {
			if !strings.HasPrefix(a, "--") {
				continue
			}
			name := strings.TrimRight(strings.SplitN(strings.TrimPrefix(a, "--"), "=", 2)[0], ".,;:)`")
			if !flagName.MatchString(name) { // a placeholder such as --FLAG
				continue
			}
			n++
			if !flags[name] {
				t.Errorf("%s: relayd %s: --%s is not a flag of relayd %s", dc.where, strings.Join(dc.args, " "), name, strings.Join(cmd, " "))
			}
		}
	}
	t.Logf("checked %d flags of the docs' relayd commands", n)
	if n < 20 {
		t.Fatalf("checked %d flags in the docs' commands: the extraction is broken", n)
	}
}

// The runbook's steps hold in the order given: the relays of step 0 follow
// the table and connect to both brokers, so the stream (R3 in production)
// is created there, not in step 1.
func TestRunbookCreatesTheStreamInStepZero(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(docRoot, "docs", "migration.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "## The runbook")
	if i < 0 {
		t.Fatal("migration.md has no runbook")
	}
	steps := map[string]string{}
	for line := range strings.Lines(doc[i:]) {
		if m := regexp.MustCompile(`^\| \*\*(\d|decommission) —? ?`).FindStringSubmatch(line); m != nil {
			steps[m[1]] = line
		}
	}
	step0, step1 := steps["0"], steps["1"]
	if !strings.Contains(step0, "create the stream") || !strings.Contains(step0, "--replicas 3") || !strings.Contains(step0, "RELAY_TARGETS` unset") {
		t.Errorf("runbook step 0 must create the stream (with --replicas 3) before relays that follow the table start: %q", step0)
	}
	if step1 == "" || strings.Contains(step1, "create the stream") {
		t.Errorf("runbook step 1 creates the stream, after step 0's relays needed it: %q", step1)
	}
}

// Every source a doc leans on is named: "the guidance" said nothing of
// which guidance.
func TestDocsNameWhatTheyCite(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(docRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range append(files, filepath.Join(docRoot, "README.md")) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if m := regexp.MustCompile(`(?i)\bthe (migration )?guidance\b`).FindString(string(b)); m != "" {
			t.Errorf("%s cites %q without naming it: say what it asks, or link it", filepath.Base(f), m)
		}
	}
}
