package main

import (
	"context"
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

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/sethvargo/go-envconfig"

	"github.com/relayd/relayd/backfill"
	"github.com/relayd/relayd/inbox"
	"github.com/relayd/relayd/internal/metrics"
	"github.com/relayd/relayd/schema"

	"github.com/relayd/relayd/internal/testenv"
)

// The docs are checked against the code, so that they cannot drift: every
// variable relayd reads is in docs/configuration.md with its default, every
// metric it registers is in docs/operations.md with its labels, and every
// test variable is in CONTRIBUTING.md.

const docRoot = "../.."

// docCodeDefaults are the defaults set in code rather than in an env tag.
var docCodeDefaults = map[string]string{
	"GOMAXPROCS":              strconv.Itoa(defaultProcs),
	"RELAY_BACKFILL_PREFETCH": strconv.Itoa(backfill.DefaultPrefetch),
}

// docVar is a variable the code reads: its default ("" for none) and
// whether it is required.
type docVar struct {
	def      string
	required bool
	where    string
}

// sourceFiles parses every Go file of the module, tests included, except
// the benchmark's.
func docSourceFiles(t *testing.T) map[string]*ast.File {
	t.Helper()
	files := map[string]*ast.File{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(docRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != docRoot && (strings.HasPrefix(name, ".") || name == "relayd-bench" || name == "bin" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(docRoot, path)
		files[filepath.ToSlash(rel)] = f
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("found %d Go files under %s", len(files), docRoot)
	}
	return files
}

// testSupport reports whether a file belongs to the tests, whose variables
// CONTRIBUTING.md documents.
func docTestSupport(path string) bool {
	return strings.HasSuffix(path, "_test.go") || strings.HasPrefix(path, "internal/testenv/")
}

// readVars finds what relayd reads from the environment: the env tags
// go-envconfig processes, and the names passed to a Lookup or os.Getenv.
func docReadVars(t *testing.T, files map[string]*ast.File) map[string]docVar {
	t.Helper()
	vars := map[string]docVar{}
	for path, f := range files {
		if docTestSupport(path) {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Field:
				name, opts, def, ok := testenv.EnvTag(n)
				if !ok {
					return true
				}
				vars[name] = docVar{where: path, def: def, required: strings.Contains(opts, "required")}
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || len(n.Args) != 1 || !slices.Contains([]string{"Lookup", "Getenv", "LookupEnv"}, sel.Sel.Name) {
					return true
				}
				lit, ok := n.Args[0].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				name, _ := strconv.Unquote(lit.Value)
				if _, tagged := vars[name]; !tagged && regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`).MatchString(name) {
					vars[name] = docVar{where: path}
				}
			}
			return true
		})
	}
	// A Lookup seen before the struct that tags the same variable.
	for name, v := range vars {
		if def, ok := docCodeDefaults[name]; ok {
			v.def = def
			vars[name] = v
		}
	}
	return vars
}

// mdRows returns the rows of path's markdown tables whose first cell is a
// single name in backticks matching re, keyed by that name.
func docTableRows(t *testing.T, path string, re *regexp.Regexp) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(docRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "|") || !strings.HasSuffix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		m := regexp.MustCompile("^`([^`]+)`$").FindStringSubmatch(cells[0])
		if m == nil || !re.MatchString(m[1]) {
			continue
		}
		key := m[1]
		if i := strings.Index(key, "{"); i >= 0 {
			key = key[:i]
		}
		if _, dup := rows[key]; dup {
			t.Errorf("%s: %s has two rows: say it once", path, key)
		}
		rows[key] = append([]string{m[1]}, cells[1:]...)
	}
	return rows
}

var docEnvName = regexp.MustCompile(`^(RELAY_[A-Z0-9_]+|GOMAXPROCS)$`)

// wantDefault is how a default is written in a table's default column.
func docDefault(v docVar) string {
	switch {
	case v.required:
		return "— (required)"
	case v.def == "":
		return "—"
	}
	return "`" + v.def + "`"
}

// Every variable relayd reads is in docs/configuration.md, once, with the
// default the code gives it; the page names no variable the code does not
// read. No other page has a table of them (docs_once_test.go).
func TestConfigurationDocumentsEveryVariable(t *testing.T) {
	vars := docReadVars(t, docSourceFiles(t))
	for _, name := range []string{"RELAY_DATABASE_URL", "RELAY_TARGETS", "RELAY_SHUTDOWN_TIMEOUT", "RELAY_BACKFILL_QUEUE", "GOMAXPROCS"} {
		if _, ok := vars[name]; !ok {
			t.Fatalf("the source scan missed %s: found %v", name, slices.Sorted(maps.Keys(vars)))
		}
	}
	for _, page := range []string{"docs/configuration.md"} {
		rows := docTableRows(t, page, docEnvName)
		if len(rows) < 5 {
			t.Fatalf("%s: found %d variables in its tables", page, len(rows))
		}
		for name, cells := range rows {
			v, ok := vars[name]
			if !ok {
				t.Errorf("%s documents %s, which relayd does not read", page, name)
				continue
			}
			if len(cells) < 3 || cells[1] != docDefault(v) {
				t.Errorf("%s: %s's default is %q, want %q (%s)", page, name, cells[1], docDefault(v), v.where)
			}
		}
		if page != "docs/configuration.md" {
			continue
		}
		for name, v := range vars {
			if _, ok := rows[name]; !ok {
				t.Errorf("%s reads %s (default %s), which docs/configuration.md does not document", v.where, name, docDefault(v))
			}
		}
	}
}

// Each range "min–max" in docs/configuration.md is the one relayd enforces:
// both ends accepted, one past either end refused naming the variable.
func TestConfigurationRanges(t *testing.T) {
	inConfig := map[string]bool{}
	ct := reflect.TypeFor[config]()
	for i := range ct.NumField() {
		name, _, _ := strings.Cut(ct.Field(i).Tag.Get("env"), ",")
		inConfig[name] = true
	}
	checked := 0
	for name, cells := range docTableRows(t, "docs/configuration.md", docEnvName) {
		m := regexp.MustCompile(`^(\d+)–(\d+)$`).FindStringSubmatch(cells[2])
		if m == nil || !inConfig[name] {
			continue
		}
		lo, _ := strconv.Atoi(m[1])
		hi, _ := strconv.Atoi(m[2])
		for v, ok := range map[int]bool{lo: true, hi: true, lo - 1: false, hi + 1: false} {
			env := base()
			env[name] = strconv.Itoa(v)
			_, err := loadConfig(context.Background(), envconfig.MapLookuper(env))
			if ok && err != nil || !ok && (err == nil || !strings.HasPrefix(err.Error(), name)) {
				t.Errorf("docs/configuration.md gives %s the range %d–%d, but %s=%d: %v", name, lo, hi, name, v, err)
			}
		}
		checked++
	}
	if checked < 3 {
		t.Errorf("checked %d ranges, want those of RELAY_BATCH_SIZE, RELAY_WORKERS and RELAY_MAX_ATTEMPTS", checked)
	}
}

// docRecorder is a Registerer that keeps what each collector describes.
type docRecorder struct {
	reg   *prometheus.Registry
	descs []*prometheus.Desc
}

func (r *docRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		r.descs = append(r.descs, d)
	}
	return r.reg.Register(c)
}

func (r *docRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *docRecorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

var docDescRE = regexp.MustCompile(`^Desc\{fqName: "([^"]+)", .*constLabels: \{([^}]*)\}, variableLabels: \{([^}]*)\}\}$`)

// registered returns the metrics relayd's packages register, with their
// labels (const and variable, sorted, comma-separated).
func docRegistered(t *testing.T) map[string]string {
	t.Helper()
	r := &docRecorder{reg: prometheus.NewRegistry()}
	// relayd's own as run and backfill register them; the inbox as a
	// consumer does, on its own Registerer.
	reg := withOutboxLabel(r, schema.Table{Name: schema.DefaultTable})
	metrics.NewRelay(reg, "test")
	metrics.NewOutbox(reg)
	metrics.NewPostgres(reg)
	metrics.NewConsoleReads(reg)
	(&reporter{}).register(reg)
	pool, err := pgxpool.New(context.Background(), "postgres://docs@127.0.0.1:1/docs") // connects lazily: never here
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := inbox.New(pool, inbox.Config{Registerer: r}); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, d := range r.descs {
		m := docDescRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		var labels []string
		for lp := range strings.SplitSeq(m[2], ",") {
			if name, _, ok := strings.Cut(lp, "="); ok {
				labels = append(labels, name)
			}
		}
		for l := range strings.SplitSeq(m[3], ",") {
			if l != "" {
				labels = append(labels, l)
			}
		}
		slices.Sort(labels)
		out[m[1]] = strings.Join(labels, ",")
	}
	return out
}

// docNotMetrics are relayd_ names in the source that are not metrics.
var docNotMetrics = map[string]bool{"relayd_verify_stream": true}

// Every metric relayd registers is in docs/operations.md, once, with its
// labels, and the page lists none it does not register. A relayd_ name in
// the source that the page lacks fails too: a metric registered somewhere
// this test does not call still shows. The outbox label every relayd_*
// series but the inbox's carries is said once, not in each row.
func TestOperationsDocumentsEveryMetric(t *testing.T) {
	const page = "docs/operations.md"
	got := docRegistered(t)
	rows := docTableRows(t, page, regexp.MustCompile(`^relayd_[a-z0-9_]+(\{[a-z_,]+\})?$`))
	b, err := os.ReadFile(filepath.Join(docRoot, page))
	if err != nil {
		t.Fatal(err)
	}
	everySeries := regexp.MustCompile("Every series `relayd run` and `relayd backfill` serve[^.]*\\scarries\\s+`outbox`[^.]*`RELAY_OUTBOX_TABLE`")
	if !everySeries.MatchString(docSection(t, "operations.md", "Metrics")) {
		t.Errorf("%s, Metrics, must say once that every series `relayd run` and `relayd backfill` serve carries `outbox`, the `RELAY_OUTBOX_TABLE`", page)
	}
	runtime := 0
	for name, labels := range got {
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			runtime++
			continue
		}
		if !strings.HasPrefix(name, "relayd_inbox_") {
			ls := strings.Split(labels, ",")
			if !slices.Contains(ls, "outbox") {
				t.Errorf("%s has no outbox label, which %s says every relayd_* series of run and backfill carries", name, page)
			}
			labels = strings.Join(slices.DeleteFunc(ls, func(l string) bool { return l == "outbox" }), ",")
		}
		cells, ok := rows[name]
		if !ok {
			t.Errorf("relayd registers %s, which %s does not document", name, page)
			continue
		}
		documented := ""
		if _, l, ok := strings.Cut(strings.TrimSuffix(cells[0], "}"), "{"); ok {
			ls := strings.Split(l, ",")
			slices.Sort(ls)
			documented = strings.Join(ls, ",")
		}
		if documented != labels {
			t.Errorf("%s: %s has labels {%s}, want {%s}", page, cells[0], documented, labels)
		}
		if len(cells) < 3 || cells[len(cells)-1] == "" {
			t.Errorf("%s: %s has no meaning", page, name)
		}
	}
	if runtime == 0 || !strings.Contains(string(b), "`go_*`") || !strings.Contains(string(b), "`process_*`") {
		t.Errorf("%s must name the Go runtime (`go_*`) and process (`process_*`) collectors relayd registers", page)
	}
	for name := range rows {
		if _, ok := got[name]; !ok {
			t.Errorf("%s documents %s, which relayd does not register", page, name)
		}
	}
	metric := regexp.MustCompile(`^relayd_[a-z0-9_]+$`)
	for path, f := range docSourceFiles(t) {
		if docTestSupport(path) {
			continue
		}
		ast.Inspect(f, func(n ast.Node) bool {
			lit, ok := n.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, _ := strconv.Unquote(lit.Value)
			if _, ok := rows[s]; metric.MatchString(s) && !ok && !docNotMetrics[s] {
				t.Errorf("%s names %s, which %s does not document (if it is not a metric, add it to docNotMetrics)", path, s, page)
			}
			return true
		})
	}
}

// Every variable the tests read is in CONTRIBUTING.md.
func TestContributingDocumentsTestVariables(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(docRoot, "CONTRIBUTING.md"))
	if err != nil {
		t.Fatal(err)
	}
	name := regexp.MustCompile(`^RELAY_TEST_[A-Z0-9_]+$`)
	found := map[string]string{"CI": "internal/testenv"}
	for path, f := range docSourceFiles(t) {
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, _ := strconv.Unquote(lit.Value); name.MatchString(s) {
					found[s] = path
				}
			}
			return true
		})
	}
	if len(found) < 5 {
		t.Fatalf("found only %v", found)
	}
	for v, path := range found {
		if !strings.Contains(string(b), "`"+v+"`") {
			t.Errorf("%s reads %s, which CONTRIBUTING.md does not document", path, v)
		}
	}
}

// Every relative link in the README, CONTRIBUTING.md and docs/ names a file
// that exists and, with a #fragment, a heading of it (GitHub's anchors).
func TestDocLinksResolve(t *testing.T) {
	pages, _ := filepath.Glob(filepath.Join(docRoot, "docs", "*.md"))
	pages = append(pages, filepath.Join(docRoot, "README.md"), filepath.Join(docRoot, "CONTRIBUTING.md"))
	if len(pages) < 10 {
		t.Fatalf("found %d pages", len(pages))
	}
	anchors := func(path string) map[string]bool {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil
		}
		seen := map[string]bool{}
		fence := false
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "```") {
				fence = !fence
			}
			if fence || !strings.HasPrefix(line, "#") {
				continue
			}
			slug := strings.ToLower(strings.TrimSpace(strings.TrimLeft(line, "#")))
			slug = regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(slug, "")
			slug = strings.ReplaceAll(slug, " ", "-")
			for s, i := slug, 1; ; i++ {
				if !seen[s] {
					seen[s] = true
					break
				}
				s = slug + "-" + strconv.Itoa(i)
			}
		}
		return seen
	}
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s links to %s, which does not exist", page, target)
				continue
			}
			if frag != "" && !anchors(path)[frag] {
				t.Errorf("%s links to %s, but %s has no heading #%s", page, target, path, frag)
			}
			checked++
		}
	}
	if checked < 20 {
		t.Errorf("checked %d links", checked)
	}
}

// Every reference to a doc in the source — Go comments, the SQL templates and
// migrations, the deploy manifests — names a file of docs/ and, written as
// `docs/<file>.md, "Section"` or `docs/<file>.md#anchor`, one of its
// headings: code that points at a renamed section points at nothing.
func TestDocReferencesInSourceResolve(t *testing.T) {
	type heading struct{ text, slug string }
	headings := map[string][]heading{}
	docHeadings := func(file string) ([]heading, bool) {
		if h, ok := headings[file]; ok {
			return h, true
		}
		b, err := os.ReadFile(filepath.Join(docRoot, "docs", file))
		if err != nil {
			return nil, false
		}
		var hs []heading
		seen := map[string]bool{}
		fence := false
		for line := range strings.Lines(string(b)) {
			if strings.HasPrefix(line, "```") {
				fence = !fence
			}
			if fence || !strings.HasPrefix(line, "#") {
				continue
			}
			text := strings.TrimSpace(strings.TrimLeft(line, "#"))
			slug := regexp.MustCompile(`[^\p{L}\p{N} _-]`).ReplaceAllString(strings.ToLower(text), "")
			slug = strings.ReplaceAll(slug, " ", "-")
			s := slug
			for i := 1; seen[s]; i++ {
				s = slug + "-" + strconv.Itoa(i)
			}
			seen[s] = true
			hs = append(hs, heading{strings.ReplaceAll(text, "`", ""), s})
		}
		headings[file] = hs
		return hs, true
	}

	// texts returns the comments of a source file, each group on one line
	// (a section's name may wrap); for files other than Go, the whole file
	// with its comment markers taken off.
	fset := token.NewFileSet()
	texts := func(path string) []string {
		if strings.HasSuffix(path, ".go") {
			f, err := parser.ParseFile(fset, path, nil, parser.ParseComments|parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, g := range f.Comments {
				out = append(out, strings.Join(strings.Fields(g.Text()), " "))
			}
			return out
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for line := range strings.Lines(string(b)) {
			line = strings.TrimSpace(line)
			line = strings.TrimPrefix(strings.TrimPrefix(line, "--"), "#")
			lines = append(lines, line)
		}
		return []string{strings.Join(strings.Fields(strings.Join(lines, " ")), " ")}
	}

	ref := regexp.MustCompile(`docs/([a-z-]+\.md)(?:#([\w-]+)|, "([^"]{1,120})")?`)
	files, sections := 0, 0
	err := filepath.WalkDir(docRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != docRoot && (strings.HasPrefix(name, ".") || name == "bin" || name == "docs" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".go", ".sql", ".yaml", ".yml":
		default:
			return nil
		}
		rel, _ := filepath.Rel(docRoot, path)
		for _, text := range texts(path) {
			for _, m := range ref.FindAllStringSubmatch(text, -1) {
				file, anchor, section := m[1], m[2], m[3]
				hs, ok := docHeadings(file)
				if !ok {
					t.Errorf("%s refers to docs/%s, which does not exist", rel, file)
					continue
				}
				files++
				if anchor == "" && section == "" {
					continue
				}
				sections++
				var found []string
				for _, h := range hs {
					if (section != "" && h.text == section) || (anchor != "" && h.slug == anchor) {
						found = append(found, h.slug)
					}
				}
				switch {
				case len(found) == 0 && section != "":
					t.Errorf("%s refers to docs/%s, %q: no heading of that name", rel, file, section)
				case len(found) == 0:
					t.Errorf("%s refers to docs/%s#%s: no heading has that anchor", rel, file, anchor)
				case len(found) > 1:
					t.Errorf("%s refers to docs/%s, %q: %d headings have that name", rel, file, section, len(found))
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d references to docs, %d to a section", files, sections)
	if files < 20 || sections < 10 {
		t.Errorf("found %d references to docs, %d of them to a section: the scan is broken", files, sections)
	}
}
