package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The code of consumers.md's "Any language" is the Node example's and the
// Go migration's: every js block appears verbatim in the example's
// consumer.js or derive.js, and the sql block is the inbox migration with
// the name inbox (comments and blank lines aside).
func TestConsumersAnyLanguageShowsTheExample(t *testing.T) {
	const heading = "\n## Any language\n"
	page := contractRead(t, filepath.Join(docRoot, "docs", "consumers.md"))
	start := strings.Index(page, heading)
	if start < 0 {
		t.Fatal(`docs/consumers.md has no section "## Any language"`)
	}
	section := page[start+len(heading):]
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	headingLine := strings.Count(page[:start], "\n") + 2
	example := filepath.Join(docRoot, "examples", "consumers", "node")
	source := contractRead(t, filepath.Join(example, "consumer.js")) + contractRead(t, filepath.Join(example, "derive.js"))
	migration := contractRead(t, filepath.Join(docRoot, "inbox", "migrations", "00001_create_inbox.up.sql"))
	migration = strings.NewReplacer("{{.Table}}", "inbox", "{{.Name}}", "inbox").Replace(migration)
	js, sql := 0, 0
	for _, b := range contractBlocks(section) {
		switch b.lang {
		case "js":
			js++
			if !strings.Contains(source, b.code) {
				t.Errorf("docs/consumers.md:%d: the js block is in neither consumer.js nor derive.js of examples/consumers/node: copy it again from there:\n%s",
					headingLine+b.line, b.code)
			}
		case "sql":
			sql++
			if got, want := sqlStatements(b.code), sqlStatements(migration); got != want {
				t.Errorf("the sql block of \"Any language\" is not the inbox migration (inbox/migrations/00001_create_inbox.up.sql):\n%s\nwant:\n%s", got, want)
			}
		}
	}
	if js == 0 || sql != 1 {
		t.Errorf(`"Any language" has %d js blocks and %d sql blocks; want the example's core and the table`, js, sql)
	}
	if _, err := os.Stat(filepath.Join(example, "package-lock.json")); err != nil {
		t.Errorf("the Node example has no lockfile: %v", err)
	}
}

// sqlStatements is SQL without its comment lines, blank lines and trailing
// spaces.
func sqlStatements(s string) string {
	var out []string
	for line := range strings.Lines(s) {
		line = strings.TrimRight(line, " \t\n")
		if line == "" || strings.HasPrefix(strings.TrimSpace(line), "--") {
			continue
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n")
}
