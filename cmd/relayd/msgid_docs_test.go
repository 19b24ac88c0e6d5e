package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/relayd/relayd/internal/msgid"
)

// docSection is the text of docs/<page>'s section under heading, up to the
// next heading of its level or above.
func docSection(t *testing.T, page, heading string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(docRoot, "docs", page))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	level, fence := 0, false
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			l := len(line) - len(strings.TrimLeft(line, "#"))
			if level > 0 && l <= level {
				break
			}
			if strings.TrimSpace(line[l:]) == heading {
				level = l
				continue
			}
		}
		if level > 0 {
			out = append(out, line)
		}
	}
	if level == 0 {
		t.Fatalf("docs/%s has no heading %q", page, heading)
	}
	return strings.Join(out, "")
}

// The worked examples of docs/message-ids.md give the ids the vectors file
// pins (which TestVectors holds to the code).
func TestMessageIDsDocExamplesMatchVectors(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(docRoot, "inbox", "testdata", "derived-ids.json"))
	if err != nil {
		t.Fatal(err)
	}
	var vectors []struct{ Name, ID string }
	if err := json.Unmarshal(b, &vectors); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, v := range vectors {
		ids[v.Name] = v.ID
	}
	// Each example names its vector, then gives "The id is `…`".
	example := regexp.MustCompile(`(?s)The vector "([^"]+)".*?The id is ` + "`([0-9a-f-]{36})`")
	found := example.FindAllStringSubmatch(docSection(t, "message-ids.md", "Worked examples"), -1)
	if len(found) != 2 {
		t.Fatalf("docs/message-ids.md: %d worked examples found, want 2", len(found))
	}
	for _, m := range found {
		if want, ok := ids[m[1]]; !ok {
			t.Errorf("docs/message-ids.md: the example's vector %q is not in the vectors file", m[1])
		} else if m[2] != want {
			t.Errorf("docs/message-ids.md: the example %q gives id %s, the vectors file %s", m[1], m[2], want)
		}
	}
}

// The headers docs/message-ids.md says are left out of a derived id are
// those the code leaves out.
func TestMessageIDsDocBrokerHeaders(t *testing.T) {
	var doc []string
	for line := range strings.Lines(docSection(t, "message-ids.md", "Headers RabbitMQ adds")) {
		if m := regexp.MustCompile("^- `([^`]+)`$").FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			doc = append(doc, m[1])
		}
	}
	slices.Sort(doc)
	if code := msgid.BrokerHeaders(); !slices.Equal(doc, code) {
		t.Errorf("docs/message-ids.md, \"Headers RabbitMQ adds\": %v; the code (msgid.BrokerHeaders) leaves out %v", doc, code)
	}
}
