package main

import (
	"go/ast"
	"go/constant"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relayd/relayd/internal/phase"
)

// Each fact the docs state lives in one place, which a test keeps true, and
// the other pages link to it: the tables of variables, metrics, phases and
// columns each have one page; a number the docs give for a Go constant or a
// setting's default is the code's; the package map in CONTRIBUTING.md is
// the module's packages.

// oncePages are README.md, CONTRIBUTING.md and docs/*.md, by path from the
// repository's root.
func oncePages(t *testing.T) map[string]string {
	t.Helper()
	pages := map[string]string{}
	files, _ := filepath.Glob(filepath.Join(docRoot, "docs", "*.md"))
	files = append(files, filepath.Join(docRoot, "README.md"), filepath.Join(docRoot, "CONTRIBUTING.md"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(docRoot, f)
		pages[filepath.ToSlash(rel)] = string(b)
	}
	if len(pages) < 12 {
		t.Fatalf("found %d pages", len(pages))
	}
	return pages
}

// Each kind of table has one page: a row of it anywhere else restates a fact
// that page keeps, and must be a link instead.
func TestDocTablesLiveOnePlace(t *testing.T) {
	firstCell := regexp.MustCompile("^\\| `([^`]+)` \\|")
	homes := []struct {
		what string
		home string
		row  func(line, cell string) bool
	}{
		{"a variable relayd reads", "docs/configuration.md", func(_, c string) bool {
			return docEnvName.MatchString(c) && !strings.HasPrefix(c, "RELAY_TEST_")
		}},
		{"a test variable", "CONTRIBUTING.md", func(_, c string) bool { return strings.HasPrefix(c, "RELAY_TEST_") }},
		{"a metric", "docs/operations.md", func(_, c string) bool { return strings.HasPrefix(c, "relayd_") }},
		{"an OpenTelemetry variable", "docs/tracing.md", func(_, c string) bool { return strings.HasPrefix(c, "OTEL_") }},
		{"a phase", "docs/migration.md", func(line, _ string) bool { return regexp.MustCompile(`^\| [0-9] — `).MatchString(line) }},
		{"a column of the outbox", "docs/producers.md", func(line, _ string) bool { return strings.HasPrefix(line, "| column |") }},
	}
	found := map[string]int{}
	for page, text := range oncePages(t) {
		for i, line := range strings.Split(text, "\n") {
			cell := ""
			if m := firstCell.FindStringSubmatch(line); m != nil {
				cell = m[1]
			}
			for _, h := range homes {
				if !h.row(line, cell) {
					continue
				}
				if page != h.home {
					t.Errorf("%s:%d: a table row of %s (%q): its table is %s's; link to it instead", page, i+1, h.what, strings.TrimSpace(line), h.home)
					continue
				}
				found[h.what]++
			}
		}
	}
	for _, h := range homes {
		if found[h.what] == 0 {
			t.Errorf("%s has no table row of %s: the scan is broken", h.home, h.what)
		}
	}
	// "The number to watch" is said once, in docs/operations.md.
	heading := regexp.MustCompile(`(?m)^#+ The number to watch$`)
	for page, text := range oncePages(t) {
		if n := len(heading.FindAllString(text, -1)); n > 0 && page != "docs/operations.md" {
			t.Errorf("%s has a section \"The number to watch\": it is docs/operations.md's; link to it", page)
		}
	}
}

// The phase table of docs/migration.md is the code's: each row's phase, in
// the order of the move, with its runbook step.
func TestPhaseTableIsTheCodes(t *testing.T) {
	row := regexp.MustCompile("(?m)^\\| ([0-9]) — [^|]+\\| `relayd phase set ([a-z]+)` \\|")
	rows := row.FindAllStringSubmatch(oncePages(t)["docs/migration.md"], -1)
	if len(rows) != len(phase.Names) {
		t.Fatalf("docs/migration.md's phase table has %d rows, the code %d phases (%v)", len(rows), len(phase.Names), phase.Names)
	}
	for i, n := range phase.Names {
		if rows[i][2] != string(n) || rows[i][1] != strconv.Itoa(n.Step()) {
			t.Errorf("docs/migration.md's phase row %d: step %s, relayd phase set %s; the code's phase %d is %s, step %d", i+1, rows[i][1], rows[i][2], i+1, n, n.Step())
		}
	}
}

// onceConst is a Go constant of the module: its value, and whether it is a
// time.Duration.
type onceConst struct {
	val      constant.Value
	duration bool
	where    string
}

// onceConsts evaluates the package-level constants of the module's code
// (tests and the bench aside), by package name: "relay.quickWalkEvery".
// What it cannot evaluate (iota, a call) it leaves out.
func onceConsts(t *testing.T) map[string][]onceConst {
	t.Helper()
	type decl struct {
		pkg, where string
		expr       ast.Expr
	}
	decls := map[string]decl{} // pkg.Name
	for p, f := range docSourceFiles(t) {
		if docTestSupport(p) {
			continue
		}
		pkg := f.Name.Name
		for _, d := range f.Decls {
			g, ok := d.(*ast.GenDecl)
			if !ok || (g.Tok != token.CONST && g.Tok != token.VAR) {
				continue
			}
			for _, s := range g.Specs {
				vs := s.(*ast.ValueSpec)
				if len(vs.Values) != len(vs.Names) {
					continue
				}
				for i, n := range vs.Names {
					decls[pkg+"."+n.Name] = decl{pkg, p, vs.Values[i]}
					// A backoff.Doubling: its floor and cap, as
					// name.Floor and name.Cap.
					if cl, ok := vs.Values[i].(*ast.CompositeLit); ok {
						if sel, ok := cl.Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Doubling" {
							for _, el := range cl.Elts {
								if kv, ok := el.(*ast.KeyValueExpr); ok {
									if k, ok := kv.Key.(*ast.Ident); ok {
										decls[pkg+"."+n.Name+"."+k.Name] = decl{pkg, p, kv.Value}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	units := map[string]time.Duration{"Nanosecond": time.Nanosecond, "Microsecond": time.Microsecond, "Millisecond": time.Millisecond,
		"Second": time.Second, "Minute": time.Minute, "Hour": time.Hour}
	done := map[string]*onceConst{}
	var eval func(pkg string, e ast.Expr, depth int) (constant.Value, bool, bool)
	lookup := func(key string, depth int) (constant.Value, bool, bool) {
		if c, ok := done[key]; ok {
			return c.val, c.duration, c.val != nil
		}
		d, ok := decls[key]
		if !ok || depth > 20 {
			return nil, false, false
		}
		v, dur, ok := eval(d.pkg, d.expr, depth+1)
		if ok {
			done[key] = &onceConst{v, dur, d.where}
		}
		return v, dur, ok
	}
	eval = func(pkg string, e ast.Expr, depth int) (constant.Value, bool, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.INT && e.Kind != token.FLOAT {
				return nil, false, false
			}
			return constant.MakeFromLiteral(e.Value, e.Kind, 0), false, true
		case *ast.ParenExpr:
			return eval(pkg, e.X, depth)
		case *ast.Ident:
			return lookup(pkg+"."+e.Name, depth)
		case *ast.SelectorExpr:
			x, ok := e.X.(*ast.Ident)
			if !ok {
				return nil, false, false
			}
			if x.Name == "time" {
				u, ok := units[e.Sel.Name]
				return constant.MakeInt64(int64(u)), true, ok
			}
			return lookup(x.Name+"."+e.Sel.Name, depth)
		case *ast.CallExpr: // a conversion: time.Duration(n)
			if len(e.Args) != 1 {
				return nil, false, false
			}
			v, dur, ok := eval(pkg, e.Args[0], depth)
			if sel, isSel := e.Fun.(*ast.SelectorExpr); isSel && sel.Sel.Name == "Duration" {
				dur = true
			}
			return v, dur, ok
		case *ast.BinaryExpr:
			x, xd, ok1 := eval(pkg, e.X, depth)
			y, yd, ok2 := eval(pkg, e.Y, depth)
			if !ok1 || !ok2 {
				return nil, false, false
			}
			switch e.Op {
			case token.SHL, token.SHR:
				s, _ := constant.Uint64Val(y)
				return constant.Shift(x, e.Op, uint(s)), xd, true
			case token.QUO:
				if x.Kind() == constant.Int && y.Kind() == constant.Int {
					return constant.BinaryOp(x, token.QUO_ASSIGN, y), xd || yd, true
				}
			}
			return constant.BinaryOp(x, e.Op, y), xd || yd, true
		}
		return nil, false, false
	}
	out := map[string][]onceConst{}
	for key := range decls {
		if _, _, ok := lookup(key, 0); ok {
			c := *done[key]
			out[key] = append(out[key], c)
			_, name, _ := strings.Cut(key, ".")
			out[name] = append(out[name], c)
		}
	}
	return out
}

// docValue reads a value as the docs write it, "4,096", "100 ms", "5 min",
// "64 KiB": its number, and its unit's factor (0 for a plain number).
func docValue(s string) (constant.Value, time.Duration, bool) {
	m := regexp.MustCompile(`^(\d[\d,]*(?:\.\d+)?)(?:\s*(ms|µs|s|min|h|KiB|MiB))?$`).FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return nil, 0, false
	}
	v := constant.MakeFromLiteral(strings.ReplaceAll(m[1], ",", ""), token.FLOAT, 0)
	if !strings.Contains(m[1], ".") {
		v = constant.MakeFromLiteral(strings.ReplaceAll(m[1], ",", ""), token.INT, 0)
	}
	unit := map[string]time.Duration{"": 0, "µs": time.Microsecond, "ms": time.Millisecond, "s": time.Second, "min": time.Minute, "h": time.Hour, "KiB": -1 << 10, "MiB": -1 << 20}[m[2]]
	return v, unit, true
}

// A value the docs give a Go constant or a setting, written "`name`
// (value)" — "`quickWalkEvery` (100 ms)", "`backfill.DefaultPrefetch` (4 ×
// … = 4,096)", "`RELAY_STATS_INTERVAL` (5 s)" — is the code's. A bare name
// the module declares in two packages with two values must be qualified.
// This is how a number in the prose stays true; a number the docs give
// otherwise should name what it is instead.
func TestDocNumbersAreTheCodes(t *testing.T) {
	consts := onceConsts(t)
	if len(consts) < 100 {
		t.Fatalf("evaluated %d constants: the scan is broken", len(consts))
	}
	vars := docReadVars(t, docSourceFiles(t))
	ref := regexp.MustCompile("`(?:([a-z][a-z0-9]*)\\.)?([A-Za-z_][A-Za-z0-9_]*)` \\(([^()]*)\\)")
	doubling := regexp.MustCompile(`^(\S+ \S+) doubling (?:up )?to (\S+ \S+)$`)
	checked := map[string]int{}
	for page, text := range oncePages(t) {
		flat, lineOf := docFlatten(text)
		var bare []int // design.md: where a checked value is, masked
		for _, idx := range ref.FindAllStringSubmatchIndex(flat, -1) {
			bare = append(bare, idx[0], idx[1])
			m := []string{flat[idx[0]:idx[1]], "", flat[idx[4]:idx[5]], flat[idx[6]:idx[7]]}
			if idx[2] >= 0 {
				m[1] = flat[idx[2]:idx[3]]
			}
			i := lineOf[idx[0]] - 1
			{
				pkg, name, inner := m[1], m[2], m[3]
				if j := strings.LastIndex(inner, "="); j >= 0 {
					inner = inner[j+1:]
				}
				inner = strings.TrimSuffix(strings.TrimSpace(inner), " by default")
				where := page + ":" + strconv.Itoa(i+1)
				key := name
				if pkg != "" {
					key = pkg + "." + name
				}
				if d := doubling.FindStringSubmatch(inner); d != nil {
					for j, field := range []string{"Floor", "Cap"} {
						want, unit, ok := docValue(d[j+1])
						cs := consts[key+"."+field]
						if !ok || len(cs) == 0 {
							t.Errorf("%s: `%s` (%s): no backoff.Doubling of that name, or no %s in it", where, key, inner, field)
							continue
						}
						checked[page]++
						for _, c := range cs {
							if !docValueEqual(want, unit, c.val, 1) {
								t.Errorf("%s: `%s` (%s): its %s is %s ns (%s)", where, key, inner, field, c.val, c.where)
							}
						}
					}
					continue
				}
				want, unit, ok := docValue(inner)
				if !ok {
					continue
				}
				if v, isVar := vars[name]; isVar && pkg == "" {
					checked[page]++
					got, gunit, ok := docValue(v.def)
					if d, err := time.ParseDuration(v.def); err == nil && strings.ContainsAny(v.def, "hms") {
						got, gunit, ok = constant.MakeInt64(int64(d)), 1, true
					}
					if !ok || !docValueEqual(want, unit, got, gunit) {
						t.Errorf("%s: `%s` (%s): its default is %q (%s)", where, name, inner, v.def, v.where)
					}
					continue
				}
				cs := consts[key]
				if len(cs) == 0 {
					continue
				}
				checked[page]++
				for _, c := range cs {
					gunit := time.Duration(0)
					if c.duration {
						gunit = 1
					}
					if !docValueEqual(want, unit, c.val, gunit) {
						t.Errorf("%s: `%s` (%s): the code's is %s%s (%s)%s", where, key, inner, c.val, map[bool]string{true: " ns", false: ""}[c.duration], c.where,
							map[bool]string{true: ": the name is in several packages, qualify it", false: ""}[len(cs) > 1])
					}
				}
			}
		}
		if page != "docs/design.md" {
			continue
		}
		// design.md gives no duration but a checked one, or one of the
		// libraries' (docDesignForeign): a number of the code says its name.
		masked := []byte(flat)
		for j := 0; j < len(bare); j += 2 {
			for k := bare[j]; k < bare[j+1]; k++ {
				masked[k] = 'X'
			}
		}
		for _, idx := range docDuration.FindAllIndex(masked, -1) {
			context := flat[max(0, idx[0]-40):min(len(flat), idx[1]+25)]
			if !slices.ContainsFunc(docDesignForeign, func(f string) bool { return strings.Contains(context, f) }) {
				t.Errorf("docs/design.md:%d: %q states a duration without the constant or setting it is: write it as `name` (value), which this test checks, or name the setting", lineOf[idx[0]], context)
			}
		}
	}
	t.Logf("numbers checked per page: %v", checked)
	if checked["docs/design.md"] < 20 {
		t.Errorf("checked %d numbers in docs/design.md: the scan is broken, or design.md states its constants without their names", checked["docs/design.md"])
	}
}

// docDuration is a duration in prose: "20 ms", "5 s", "2 min".
var docDuration = regexp.MustCompile(`\b\d[\d,.]*\s?(?:ms|µs|s|min|h)\b`)

// docDesignForeign are the durations design.md gives that are not relayd's:
// amqp091-go's.
var docDesignForeign = []string{"has not taken within 5 s", "blocked, 5 s per remaining"}

// docFlatten joins a page's lines, each line break and the indentation
// after it one space, so that "`name`\n  (value)" reads as on one line;
// lineOf gives each byte's line.
func docFlatten(text string) (string, []int) {
	var b strings.Builder
	var lineOf []int
	line := 1
	for i := 0; i < len(text); i++ {
		if text[i] == '\n' {
			line++
			b.WriteByte(' ')
			lineOf = append(lineOf, line)
			for i+1 < len(text) && text[i+1] == ' ' {
				i++
			}
			continue
		}
		b.WriteByte(text[i])
		lineOf = append(lineOf, line)
	}
	return b.String(), lineOf
}

// docValueEqual compares a documented value (unit: a duration's factor, a
// byte factor as a negative, or 0) with the code's (gunit 1: nanoseconds).
func docValueEqual(want constant.Value, unit time.Duration, got constant.Value, gunit time.Duration) bool {
	switch {
	case unit > 0 && gunit == 1:
		ns := constant.BinaryOp(want, token.MUL, constant.MakeInt64(int64(unit)))
		return constant.Compare(constant.ToInt(ns), token.EQL, got)
	case unit > 0 || gunit == 1:
		return false
	case unit < 0:
		want = constant.BinaryOp(want, token.MUL, constant.MakeInt64(int64(-unit)))
	}
	return constant.Compare(want, token.EQL, got)
}

// The package map in CONTRIBUTING.md names each package of the module, and
// only directories that exist: one row per package, its files in its
// package doc (`go doc ./relay`).
func TestContributingMapsEveryPackage(t *testing.T) {
	text := oncePages(t)["CONTRIBUTING.md"]
	start := strings.Index(text, "## The package map")
	if start < 0 {
		t.Fatal("CONTRIBUTING.md has no section \"The package map\"")
	}
	section := text[start+len("## The package map"):]
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	mapped := map[string]bool{}
	cell := regexp.MustCompile("`([a-z0-9_./-]+)/`")
	for line := range strings.Lines(section) {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		first := strings.SplitN(line, "|", 3)[1]
		for _, m := range cell.FindAllStringSubmatch(first, -1) {
			dir := m[1]
			if st, err := os.Stat(filepath.Join(docRoot, dir)); err != nil || !st.IsDir() {
				t.Errorf("CONTRIBUTING.md's package map names %s/, which is no directory", dir)
			}
			mapped[dir] = true
		}
	}
	// The module's packages: the directories holding a Go file (as go list
	// ./... lists them; testdata, hidden and node_modules directories
	// aside).
	pkgs := map[string]bool{}
	err := filepath.WalkDir(docRoot, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if p != docRoot && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(name, ".go") {
			rel, _ := filepath.Rel(docRoot, filepath.Dir(p))
			pkgs[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 20 || !pkgs["relay"] || !pkgs["internal/phase"] {
		t.Fatalf("found the packages %v: the scan is broken", pkgs)
	}
	for p := range pkgs {
		if !mapped[p] {
			t.Errorf("CONTRIBUTING.md's package map lacks %s/ (a package of the module): add its row", p)
		}
	}
	for dir := range mapped {
		if pkgs[dir] {
			continue
		}
		// A directory that is no Go package may be mapped when a package
		// holds it (deploy/kubernetes/) or it is an example of its own.
		if !pkgs[path.Dir(dir)] && !strings.HasPrefix(dir, "examples/") {
			t.Errorf("CONTRIBUTING.md's package map names %s/, which is no package of the module", dir)
		}
	}
	if !regexp.MustCompile("`go doc ").MatchString(section) {
		t.Error("CONTRIBUTING.md's package map must point at the package docs (`go doc ./relay`) for the files")
	}
	if slices.Contains(strings.Fields(section), "`relay.go`") {
		t.Error("CONTRIBUTING.md's package map lists files: they are in each package's doc")
	}
}
