package main

import (
	"cmp"
	"context"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/relayd/relayd/internal/outboxsql"
	"github.com/relayd/relayd/internal/testenv"
	"github.com/relayd/relayd/schema"
)

// The docs' promises that docs_test.go does not hold: the stream and
// subjects the examples read, the variables said to steer the backfill, the
// tests the docs cite, what relayd does to the outbox's rows, and the
// Postgres grants docs/deploying.md gives.

// contractDefault is the default the env tag of config gives name.
func contractDefault(t *testing.T, name string) string {
	t.Helper()
	ct := reflect.TypeFor[config]()
	for i := range ct.NumField() {
		parts := strings.Split(ct.Field(i).Tag.Get("env"), ",")
		if parts[0] != name {
			continue
		}
		for _, p := range parts[1:] {
			if v, ok := strings.CutPrefix(strings.TrimSpace(p), "default="); ok {
				return v
			}
		}
	}
	t.Fatalf("config has no default for %s", name)
	return ""
}

// contractPages are the pages a reader starts from.
func contractPages(t *testing.T) []string {
	t.Helper()
	pages, _ := filepath.Glob(filepath.Join(docRoot, "docs", "*.md"))
	pages = append(pages, filepath.Join(docRoot, "README.md"), filepath.Join(docRoot, "CONTRIBUTING.md"),
		filepath.Join(docRoot, "deploy", "kubernetes", "README.md"))
	if len(pages) < 12 {
		t.Fatalf("found %d pages", len(pages))
	}
	return pages
}

func contractRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// contractBlock is a fenced code block, with the prose before it: a name
// the block uses may be introduced there.
type contractBlock struct {
	lang, code, before string
	line               int
}

func contractBlocks(text string) []contractBlock {
	var blocks []contractBlock
	var cur *contractBlock
	var prose strings.Builder
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```"):
			cur = &contractBlock{lang: strings.TrimPrefix(trimmed, "```"), before: prose.String(), line: i + 1}
			prose.Reset()
		case cur != nil && trimmed == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case cur != nil:
			cur.code += line + "\n"
		default:
			prose.WriteString(line + "\n")
		}
	}
	return blocks
}

var (
	// A stream named in Go (nats.go jetstream and its older API) or JavaScript
	// (nats.js). js.Consumer takes the stream then the consumer; a Stream's
	// own Consumer takes only the consumer, so it needs the second string.
	contractStreamRE = []*regexp.Regexp{
		regexp.MustCompile(`\b(?:CreateOrUpdateConsumer|CreateConsumer|UpdateConsumer|OrderedConsumer|Stream|StreamInfo|DeleteStream|PurgeStream)\(\s*\w+\s*,\s*"([^"]+)"`),
		regexp.MustCompile(`\bConsumer\(\s*\w+\s*,\s*"([^"]+)"\s*,`),
		regexp.MustCompile(`\bBindStream\(\s*"([^"]+)"`),
		regexp.MustCompile(`StreamConfig\{[^}]*\bName:\s*"([^"]+)"`),
		regexp.MustCompile(`\b(?:consumers|streams)\.(?:get|add|update|info|delete|purge)\(\s*["'` + "`" + `]([^"'` + "`" + `]+)`),
	}
	// The subjects a consumer filters on, a stream captures, or a
	// subscription reads.
	contractSubjectRE = []*regexp.Regexp{
		regexp.MustCompile(`\b(?:FilterSubjects?|Subjects|filter_subjects?|subjects):\s*(\[\]string\{[^}]*\}|\[[^\]]*\]|"[^"]*"|'[^']*')`),
		regexp.MustCompile(`\b(?:Subscribe|QueueSubscribe|PullSubscribe|SubscribeSync|ChanSubscribe|subscribe|pullSubscribe)\(\s*("[^"]+"|'[^']+')`),
	}
	contractQuoted = regexp.MustCompile(`"([^"]*)"|'([^']*)'`)
	// A name the text introduces: a setting given a value, or a route's.
	contractSetStream  = regexp.MustCompile(`RELAY_NATS_STREAM=([A-Za-z0-9_-]+)|\bstream:\s*"?([A-Za-z0-9_-]+)`)
	contractSetPrefix  = regexp.MustCompile(`RELAY_NATS_SUBJECT_PREFIX=([^\s"'` + "`" + `]*)|\bsubject:\s*"([^"{]*)`)
	contractCodeBlocks = []string{"go", "js", "javascript", "ts", "typescript", "mjs"}
)

// Every stream and subject the Go and JavaScript examples read is one
// relayd's defaults produce (RELAY_NATS_STREAM, RELAY_NATS_SUBJECT_PREFIX +
// topic), or one the block or the prose before it introduces: a setting
// given that value (RELAY_NATS_STREAM=ORDERS) or a route's stream and
// subject. A reader who copies an example reads what relayd wrote.
func TestDocContractExamplesUseDefaultNames(t *testing.T) {
	stream := contractDefault(t, "RELAY_NATS_STREAM")
	prefix := contractDefault(t, "RELAY_NATS_SUBJECT_PREFIX")
	type source struct{ where, code, context string }
	var sources []source
	for _, page := range contractPages(t) {
		rel, _ := filepath.Rel(docRoot, page)
		for _, b := range contractBlocks(contractRead(t, page)) {
			if slices.Contains(contractCodeBlocks, strings.ToLower(b.lang)) {
				sources = append(sources, source{rel + ":" + strconv.Itoa(b.line), b.code, b.before + b.code})
			}
		}
	}
	// The compiled examples are docs too (consumers.md points at one).
	err := filepath.WalkDir(docRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != docRoot && (strings.HasPrefix(d.Name(), ".") || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, "example_test.go") {
			rel, _ := filepath.Rel(docRoot, path)
			code := contractRead(t, path)
			sources = append(sources, source{rel, code, code})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	found := 0
	for _, s := range sources {
		streams, prefixes := []string{stream}, []string{prefix}
		for _, m := range contractSetStream.FindAllStringSubmatch(s.context, -1) {
			streams = append(streams, m[1]+m[2])
		}
		for _, m := range contractSetPrefix.FindAllStringSubmatch(s.context, -1) {
			prefixes = append(prefixes, m[1]+m[2])
		}
		for _, re := range contractStreamRE {
			for _, m := range re.FindAllStringSubmatch(s.code, -1) {
				found++
				if !slices.Contains(streams, m[1]) {
					t.Errorf("%s reads the stream %q; relayd's default is %q (RELAY_NATS_STREAM): use it, or say which setting or route gives %q", s.where, m[1], stream, m[1])
				}
			}
		}
		for _, re := range contractSubjectRE {
			for _, m := range re.FindAllStringSubmatch(s.code, -1) {
				for _, q := range contractQuoted.FindAllStringSubmatch(m[1], -1) {
					found++
					subject := q[1] + q[2]
					if subject == ">" || slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(subject, p) }) {
						continue
					}
					t.Errorf("%s reads the subject %q; relayd's subjects are RELAY_NATS_SUBJECT_PREFIX (default %q) + topic: use that, or say which setting or route gives %q", s.where, subject, prefix, subject)
				}
			}
		}
	}
	if found < 2 {
		t.Errorf("found %d streams and subjects in the examples, want at least consumers.md's two: the scan is broken", found)
	}
}

// contractDerived are the fields of config that validate derives, and the
// variables each comes from (the routes: the file, and the default route
// made of the three settings).
var contractDerived = map[string][]string{
	"table":    {"RELAY_OUTBOX_TABLE"},
	"targets":  {"RELAY_TARGETS"},
	"pinned":   {"RELAY_TARGETS"},
	"logLevel": {"RELAY_LOG_LEVEL"},
	"routes":   {"RELAY_ROUTES", "RELAY_AMQP_EXCHANGE", "RELAY_NATS_SUBJECT_PREFIX", "RELAY_NATS_STREAM"},
	// The brokers' passwords go into their URLs; Postgres's is kept apart.
	"databasePassword": {"RELAY_DATABASE_PASSWORD_FILE"},
	"consoleGroups":    {"RELAY_CONSOLE_CUTOVER", "RELAY_NATS_STREAM"},
}

// contractReadsAll are the functions that read or check every variable,
// used or not: following them would make every variable the backfill's.
var contractReadsAll = regexp.MustCompile(`^(loadConfig|noEmpty|envError|validate.*)$`)

// contractBackfillUses returns the variables `relayd backfill` uses: the fields
// of config read by the functions cmdBackfill calls, transitively within
// this package (found by name, so more rather than fewer), the env tags of
// the other structs they read into, and the names they look up.
func contractBackfillUses(t *testing.T) map[string]bool {
	t.Helper()
	fields := map[string][]string{}
	ct := reflect.TypeFor[config]()
	for i := range ct.NumField() {
		f := ct.Field(i)
		if name, _, _ := strings.Cut(f.Tag.Get("env"), ","); name != "" {
			fields[f.Name] = []string{name}
		} else if vars, ok := contractDerived[f.Name]; ok {
			fields[f.Name] = vars
		} else {
			t.Fatalf("config.%s has no env tag and no entry in contractDerived: add the variables it comes from", f.Name)
		}
	}
	paths, _ := filepath.Glob("*.go")
	funcs := map[string][]*ast.FuncDecl{}
	tags := map[string][]string{} // struct type → its env tags
	fset := token.NewFileSet()
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				funcs[d.Name.Name] = append(funcs[d.Name.Name], d)
			case *ast.GenDecl:
				for _, s := range d.Specs {
					ts, ok := s.(*ast.TypeSpec)
					if !ok || ts.Name.Name == "config" {
						continue
					}
					if st, ok := ts.Type.(*ast.StructType); ok {
						for _, fl := range st.Fields.List {
							if name, _, _, ok := testenv.EnvTag(fl); ok {
								tags[ts.Name.Name] = append(tags[ts.Name.Name], name)
							}
						}
					}
				}
			}
		}
	}
	used := map[string]bool{}
	seen := map[string]bool{}
	var visit func(name string)
	visit = func(name string) {
		if seen[name] || contractReadsAll.MatchString(name) {
			return
		}
		seen[name] = true
		for _, fd := range funcs[name] {
			// A config is cfg, x.cfg, or a parameter or receiver of type
			// (*)config: other structs have fields of the same names.
			isConfig := map[string]bool{"cfg": true}
			for _, fl := range slices.Concat(fd.Type.Params.List, contractFields(fd.Recv)) {
				if typ := strings.TrimPrefix(contractTypeName(fl.Type), "*"); typ == "config" {
					for _, n := range fl.Names {
						isConfig[n.Name] = true
					}
				}
			}
			ast.Inspect(fd, func(n ast.Node) bool {
				switch n := n.(type) {
				case *ast.SelectorExpr:
					switch x := n.X.(type) {
					case *ast.Ident:
						if !isConfig[x.Name] {
							return true
						}
					case *ast.SelectorExpr:
						if x.Sel.Name != "cfg" {
							return true
						}
					default:
						return true
					}
					for _, v := range fields[n.Sel.Name] {
						used[v] = true
					}
				case *ast.Ident:
					for _, v := range tags[n.Name] {
						used[v] = true
					}
				case *ast.BasicLit:
					if s, err := strconv.Unquote(n.Value); err == nil && docEnvName.MatchString(s) {
						used[s] = true
					}
				case *ast.CallExpr:
					switch fn := n.Fun.(type) {
					case *ast.Ident:
						visit(fn.Name)
					case *ast.SelectorExpr:
						visit(fn.Sel.Name)
					case *ast.IndexExpr: // noEmpty[backfillEnv](...)
						if id, ok := fn.X.(*ast.Ident); ok {
							visit(id.Name)
						}
					}
				}
				return true
			})
		}
	}
	// Each command is a type with a Run: the root is backfill's, and no
	// other command's Run is followed by its name (backfill.Run shares it).
	seen["Run"] = true
	for _, fd := range funcs["Run"] {
		if contractTypeName(fd.Recv.List[0].Type) == "*backfillCommand" {
			funcs["backfillCommand.Run"] = []*ast.FuncDecl{fd}
		}
	}
	visit("backfillCommand.Run")
	t.Logf("relayd backfill uses %v", slices.Sorted(maps.Keys(used)))
	return used
}

// contractFields is l's fields, none for nil.
func contractFields(l *ast.FieldList) []*ast.Field {
	if l == nil {
		return nil
	}
	return l.List
}

// contractTypeName is a type as written, for a name or a pointer to one;
// "" for anything else.
func contractTypeName(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.StarExpr:
		return "*" + contractTypeName(e.X)
	}
	return ""
}

var contractSentenceEnd = regexp.MustCompile("[.;] [A-Z`(*]")

// contractNegation starts the part of a sentence that says what is not so.
var contractNegation = regexp.MustCompile(`(?i)\b(?:not|never|no|none|nor|without|instead of)\b|n't\b`)

// contractSentences splits markdown into sentences, table rows and list
// items, leaving out code blocks.
func contractSentences(text string) []string {
	text = regexp.MustCompile("(?s)```.*?```").ReplaceAllString(text, "")
	var out []string
	for _, para := range regexp.MustCompile(`\n\s*\n`).Split(text, -1) {
		for _, item := range regexp.MustCompile(`\n\s*(?:[-*] |\d+\. |\|)`).Split("\n"+para, -1) {
			item = strings.Join(strings.Fields(item), " ")
			// A sentence ends at ". " or "; " before a capital, code or a bracket.
			start := 0
			for _, m := range contractSentenceEnd.FindAllStringIndex(item, -1) {
				out = append(out, item[start:m[0]+1])
				start = m[0] + 2
			}
			out = append(out, item[start:])
		}
	}
	return out
}

// contractRelayOnly are the relays' settings a page may name beside the
// backfill, which bound what it finds without being read by it.
var contractRelayOnly = map[string]string{
	"RELAY_RETENTION": "how long the relays keep the record of delivered ids the backfill looks up",
}

// Every variable a doc says the backfill uses — named in a sentence about
// the backfill, before any "not" — is one it uses: its connections, its
// stream and subjects, its RELAY_BACKFILL_* flags. What a sentence says the
// backfill does not use is not checked.
func TestDocContractBackfillVariables(t *testing.T) {
	uses := contractBackfillUses(t)
	for _, v := range []string{"RELAY_DATABASE_URL", "RELAY_NATS_STREAM", "RELAY_ROUTES", "RELAY_BACKFILL_METRICS_ADDR"} {
		if !uses[v] {
			t.Fatalf("the scan of cmdBackfill missed %s: found %v", v, slices.Sorted(maps.Keys(uses)))
		}
	}
	if uses["RELAY_METRICS_ADDR"] {
		t.Fatal("the scan says the backfill uses RELAY_METRICS_ADDR; it serves its metrics on --metrics-addr only")
	}
	vars := docReadVars(t, docSourceFiles(t))
	units := map[string][]string{"cmd/relayd/backfill.go (relayd backfill --help)": contractSentences(strings.Join(strings.Fields(backfillHelp), " "))}
	for _, page := range contractPages(t) {
		rel, _ := filepath.Rel(docRoot, page)
		units[rel] = contractSentences(contractRead(t, page))
	}
	name := regexp.MustCompile(`RELAY_[A-Z0-9_]*[A-Z0-9]`)
	checked := 0
	for where, sentences := range units {
		for _, s := range sentences {
			if !regexp.MustCompile(`(?i)\bbackfill\b`).MatchString(s) {
				continue
			}
			said := s
			if loc := contractNegation.FindStringIndex(s); loc != nil {
				said = s[:loc[0]]
			}
			for _, v := range name.FindAllString(said, -1) {
				if _, ok := vars[v]; !ok {
					if !strings.HasPrefix(s[strings.Index(s, v)+len(v):], "_<") { // RELAY_BACKFILL_<FLAG>
						t.Errorf("%s names %s beside the backfill, which relayd does not read: %q", where, v, s)
					}
					continue
				}
				checked++
				if !uses[v] && contractRelayOnly[v] == "" {
					t.Errorf("%s names %s beside the backfill, which the backfill does not use: %q", where, v, s)
				}
			}
		}
	}
	if checked < 3 {
		t.Errorf("checked %d variables beside the backfill: the scan is broken", checked)
	}
}

// contractTestFuncs returns the test, example, benchmark and fuzz functions
// of the module by package directory.
func contractTestFuncs(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(docRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != docRoot && (strings.HasPrefix(d.Name(), ".") || d.Name() == "bin" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir, _ := filepath.Rel(docRoot, filepath.Dir(path))
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && contractTestName.MatchString(fd.Name.Name) {
				out[filepath.ToSlash(dir)] = append(out[filepath.ToSlash(dir)], fd.Name.Name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

var (
	contractTestName = regexp.MustCompile(`^(?:Test|Example|Benchmark|Fuzz)(?:[A-Z_][A-Za-z0-9_]*)?$`)
	contractCited    = regexp.MustCompile(`\b(?:Test|Example|Benchmark|Fuzz)[A-Z_][A-Za-z0-9_]*`)
	// A -run flag and its pattern, quoted or not; the packages of its
	// command line.
	contractRun     = regexp.MustCompile(`(?:^|[\s(` + "`" + `])-(?:test\.)?run[ =]('[^']*'|"[^"]*"|[^\s` + "`" + `)'"]+)`)
	contractPackage = regexp.MustCompile(`(?:^|\s)(\./[\w./-]*)`)
)

// contractCiting returns the texts that may cite a test: the pages, the
// deploy manifests and rules, the Makefile and CI script, and the comments
// and string literals of the Go source (a failure message that says which
// test to run).
func contractCiting(t *testing.T) map[string]string {
	t.Helper()
	texts := map[string]string{}
	for _, p := range contractPages(t) {
		rel, _ := filepath.Rel(docRoot, p)
		texts[rel] = contractRead(t, p)
	}
	fset := token.NewFileSet()
	err := filepath.WalkDir(docRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(docRoot, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			if path != docRoot && (strings.HasPrefix(d.Name(), ".") && rel != ".ci" || d.Name() == "bin" || d.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch {
		case strings.HasPrefix(rel, "deploy/") && slices.Contains([]string{".yaml", ".yml", ".md", ".json"}, filepath.Ext(path)),
			rel == "Makefile", strings.HasPrefix(rel, ".ci/"):
			texts[rel] = contractRead(t, path)
		case filepath.Ext(path) == ".go" && rel != "cmd/relayd/docs_contract_test.go": // the checker's own patterns
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				return err
			}
			var b strings.Builder
			for _, g := range f.Comments {
				b.WriteString(g.Text() + "\n")
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
					s, _ := strconv.Unquote(lit.Value)
					b.WriteString(s + "\n")
				}
				return true
			})
			texts[rel] = b.String()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return texts
}

// Every test a doc, manifest or message cites exists: a `-run PATTERN`
// matches a test of the package its command names (as go test matches it),
// and a test named in prose is a function of that name.
func TestDocContractCitedTestsExist(t *testing.T) {
	tests := contractTestFuncs(t)
	all := map[string]bool{}
	for _, names := range tests {
		for _, n := range names {
			all[n] = true
		}
	}
	if !all["TestKubernetes"] || !all["TestDocContractCitedTestsExist"] {
		t.Fatalf("the scan of the tests is broken: found %d", len(all))
	}
	runs, named := 0, 0
	for where, text := range contractCiting(t) {
		// The -run flags, each matched against the packages on its line.
		for _, line := range strings.Split(text, "\n") {
			for _, m := range contractRun.FindAllStringSubmatchIndex(line, -1) {
				pattern := strings.Trim(line[m[2]:m[3]], `'"`)
				top, _, _ := strings.Cut(pattern, "/") // go test's subtest separator
				re, err := regexp.Compile(top)
				if err != nil {
					t.Errorf("%s: -run %s is not a regular expression: %v", where, pattern, err)
					continue
				}
				var dirs []string
				for _, p := range contractPackage.FindAllStringSubmatch(line, -1) {
					if dir := strings.Trim(strings.TrimPrefix(p[1], "./"), "/"); dir != "..." && !strings.HasSuffix(dir, "/...") {
						dirs = append(dirs, cmp.Or(dir, "."))
					}
				}
				runs++
				matched := false
				for dir, names := range tests {
					if len(dirs) > 0 && !slices.Contains(dirs, dir) {
						continue
					}
					matched = matched || slices.ContainsFunc(names, re.MatchString)
				}
				if !matched {
					t.Errorf("%s: -run %s matches no test%s", where, pattern, map[bool]string{true: " of " + strings.Join(dirs, ", "), false: ""}[len(dirs) > 0])
				}
			}
			// The names in prose, the -run patterns left out.
			for _, m := range contractCited.FindAllString(contractRun.ReplaceAllString(line, ""), -1) {
				named++
				if !all[m] {
					t.Errorf("%s cites %s, which is no test function", where, m)
				}
			}
		}
	}
	t.Logf("%d -run patterns, %d tests named", runs, named)
	if runs < 3 || named < 30 {
		t.Errorf("found %d -run patterns and %d tests named: the scan is broken", runs, named)
	}
}

// relayd never inserts or updates a row of the outbox; its batches lock
// rows there and delete them (docs/producers.md, "After delivery").
func TestDocContractOutboxRowsAreOnlyLockedAndDeleted(t *testing.T) {
	table := schema.Table{Schema: "s", Name: "outbox"}
	all := outboxsql.For(table).All()
	if len(all) < 20 {
		t.Fatalf("found %d statements", len(all))
	}
	writes := regexp.MustCompile(`(?i)\b(UPDATE|INSERT\s+INTO)\s+` + regexp.QuoteMeta(table.Ident()) + `(?:\s|$)`)
	for name, q := range all {
		if m := writes.FindString(q); m != "" {
			t.Errorf("%s writes the outbox's rows (%s), which docs/producers.md says relayd never does", name, m)
		}
	}
	deletes := regexp.MustCompile(`(?i)\bDELETE\s+FROM\s+` + regexp.QuoteMeta(table.Ident()) + `\s`)
	if !deletes.MatchString(all["Record"]) || !strings.Contains(all["Claim"], "FOR UPDATE SKIP LOCKED") {
		t.Error("the record no longer deletes the outbox's rows, or the claim no longer locks them: docs/producers.md says so")
	}
}

// contractGrant is one GRANT of docs/deploying.md: privileges on objects.
type contractGrant struct {
	privs   []string
	schema  bool // ON SCHEMA
	objects []string
}

// contractGrants reads the GRANT block of docs/deploying.md's "Postgres
// privileges", checking that it names the default table and one role.
func contractGrants(t *testing.T) []contractGrant {
	t.Helper()
	text := contractRead(t, filepath.Join(docRoot, "docs", "deploying.md"))
	_, section, ok := strings.Cut(text, "\n## Postgres privileges\n")
	if !ok {
		t.Fatal(`docs/deploying.md has no section "Postgres privileges"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	table := contractDefault(t, "RELAY_OUTBOX_TABLE")
	grant := regexp.MustCompile(`^GRANT ([A-Z, ]+) ON (SCHEMA )?([a-z_, ]+) TO (\w+);$`)
	var grants []contractGrant
	for _, b := range contractBlocks(section) {
		if b.lang != "sql" {
			continue
		}
		for _, line := range strings.Split(b.code, "\n") {
			if !strings.HasPrefix(line, "GRANT") {
				continue
			}
			m := grant.FindStringSubmatch(line)
			if m == nil || m[4] != "relayd" {
				t.Fatalf("docs/deploying.md: cannot read %q (want GRANT privileges ON [SCHEMA] objects TO relayd;)", line)
			}
			g := contractGrant{privs: strings.Split(m[1], ", "), schema: m[2] != "", objects: strings.Split(m[3], ", ")}
			for _, o := range g.objects {
				if g.schema && o != "public" || !g.schema && o != table && !strings.HasPrefix(o, table+"_") {
					t.Fatalf("docs/deploying.md grants on %s: want the default table %s and its side tables, in public", o, table)
				}
			}
			grants = append(grants, g)
		}
	}
	if len(grants) < 5 {
		t.Fatalf("found %d grants in docs/deploying.md", len(grants))
	}
	return grants
}

// The grants docs/deploying.md gives the relayd role are what relayd's SQL
// needs: as a role with exactly those, every statement plans (Postgres
// checks privileges when it plans) and the start-up check of the applied
// migrations runs; without any one of them, something fails.
func TestContractPostgresGrants(t *testing.T) {
	grants := contractGrants(t)
	ctx := context.Background()
	pool := testenv.Pool(t)
	table := testenv.Outbox(t, pool)
	role := pgx.Identifier{testenv.Name("relayd")}.Sanitize()
	if _, err := pool.Exec(ctx, `CREATE ROLE `+role); err != nil {
		t.Fatal(err)
	}
	// Before the schema's cleanup: DROP ROLE needs the role's grants gone.
	t.Cleanup(func() { pool.Exec(context.Background(), `DROP OWNED BY `+role+`; DROP ROLE IF EXISTS `+role) }) //nolint:errcheck // best effort
	object := func(g contractGrant, o string) string {
		if g.schema {
			return `SCHEMA ` + pgx.Identifier{table.Schema}.Sanitize()
		}
		return pgx.Identifier{table.Schema, table.Name + strings.TrimPrefix(o, contractDefault(t, "RELAY_OUTBOX_TABLE"))}.Sanitize()
	}
	for _, g := range grants {
		for _, o := range g.objects {
			if _, err := pool.Exec(ctx, `GRANT `+strings.Join(g.privs, ", ")+` ON `+object(g, o)+` TO `+role); err != nil {
				t.Fatalf("grant %v on %s: %v", g.privs, o, err)
			}
		}
	}

	conn, err := pgx.Connect(ctx, testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `SET ROLE `+role); err != nil {
		t.Fatal(err)
	}
	connCfg, err := pgx.ParseConfig(testenv.DatabaseURL(t))
	if err != nil {
		t.Fatal(err)
	}
	db := stdlib.OpenDB(*connCfg, stdlib.OptionAfterConnect(func(ctx context.Context, c *pgx.Conn) error {
		_, err := c.Exec(ctx, `SET ROLE `+role)
		return err
	}))
	defer db.Close()

	all := outboxsql.For(table).All()
	names := slices.Sorted(maps.Keys(all))
	// plan prepares and explains statement name as the role.
	plan := func(name string) error {
		if name == "schema.Require" {
			return schema.Require(ctx, db, table)
		}
		// PREPARE outlives a rolled-back transaction: no transaction, and
		// the statement deallocated whatever happens.
		if _, err := conn.Exec(ctx, "PREPARE s AS "+all[name]); err != nil {
			return err
		}
		defer conn.Exec(ctx, "DEALLOCATE s") //nolint:errcheck // the next PREPARE fails if this did
		var n int
		if err := conn.QueryRow(ctx, `SELECT cardinality(parameter_types) FROM pg_prepared_statements WHERE name = 's'`).Scan(&n); err != nil {
			return err
		}
		explain := "EXPLAIN EXECUTE s"
		if n > 0 {
			explain += "(" + strings.TrimSuffix(strings.Repeat("NULL, ", n), ", ") + ")"
		}
		_, err := conn.Exec(ctx, explain)
		return err
	}
	names = append(names, "schema.Require")
	for _, name := range names {
		if err := plan(name); err != nil {
			t.Errorf("%s fails with the grants of docs/deploying.md: %v", name, err)
		}
	}
	if t.Failed() {
		return
	}
	denied := func(err error) bool {
		var pgErr *pgconn.PgError
		return errors.As(err, &pgErr) && pgErr.Code == "42501" // insufficient_privilege
	}
	for _, g := range grants {
		for _, o := range g.objects {
			for _, p := range g.privs {
				if _, err := pool.Exec(ctx, `REVOKE `+p+` ON `+object(g, o)+` FROM `+role); err != nil {
					t.Fatal(err)
				}
				needed := slices.ContainsFunc(names, func(n string) bool { return denied(plan(n)) })
				if _, err := pool.Exec(ctx, `GRANT `+p+` ON `+object(g, o)+` TO `+role); err != nil {
					t.Fatal(err)
				}
				if !needed {
					t.Errorf("docs/deploying.md grants %s on %s, which no statement of relayd needs", p, o)
				}
			}
		}
	}
}
