package main

import (
	"bytes"
	"context"
	"embed"
	"html/template"
	"net/http"
	"time"

	"github.com/relayd/relayd/internal/cutover"
	"github.com/relayd/relayd/internal/pghealth"
	"github.com/relayd/relayd/relay"
	"github.com/relayd/relayd/schema"
)

// The console is relayd run's read-only page on RELAY_METRICS_ADDR: the
// phase, the targets, the relays, the parked rows, the runs and the
// horizon at /, and the cutover check at /cutover. It changes nothing: the
// actions stay in the CLI. RELAY_CONSOLE=false leaves it out.

//go:embed console.html console.css console.js
var consoleFiles embed.FS

var consoleTemplates = template.Must(template.ParseFS(consoleFiles, "console.html"))

// relayState is what the console asks the running relay at each request
// (*relay.Relay). Safe for concurrent use.
type relayState interface {
	// Phase is the phase the relay runs, and the table's as it last read it.
	Phase() relay.PhaseState
	// Unready says what the relay cannot use, as /readyz: "nats: why".
	Unready() []string
}

// consoleConfig wires a console.
type consoleConfig struct {
	Table schema.Table
	// Interval is RELAY_STATS_INTERVAL: how often the page refreshes, and
	// how long one read of the page's data serves every viewer.
	Interval time.Duration
	Relay    relayState
	Figures  *consoleFigures
	// Health is the Postgres health the metrics poll read last, with the
	// holders' ages metrics.Postgres works out, and when
	// ((*metrics.Postgres).Last).
	Health func() (pghealth.Health, time.Time)
	// Load reads what only the page shows (pageLoader).
	Load func(context.Context) (pageData, error)
	// Groups are RELAY_CONSOLE_CUTOVER's; Check checks them
	// (consoleCutover), and the console adds the relays' versions.
	Groups []cutover.Group
	Check  func(context.Context) (cutover.Result, error)
	// Self is this relay's instance name, as it reports itself.
	Self string
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// console serves the page; see consoleConfig.
type console struct {
	cfg   consoleConfig
	page  *sharedRead[pageData]
	check *sharedRead[cutover.Result]
}

func newConsole(cfg consoleConfig) *console {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	c := &console{cfg: cfg}
	c.page = &sharedRead[pageData]{ttl: cfg.Interval, now: cfg.Now, load: cfg.Load, timeout: max(cfg.Interval, 5*time.Second)}
	if cfg.Check != nil {
		// A verdict serves whoever asks within an interval: a reload, or
		// another viewer, does not ask the brokers again.
		c.check = &sharedRead[cutover.Result]{ttl: cfg.Interval, now: cfg.Now, load: c.checkVersions, timeout: consoleCutoverTimeout}
	}
	return c
}

// register adds the console's routes to mux: / only, the other paths stay
// 404.
func (c *console) register(mux *http.ServeMux) {
	mux.HandleFunc("GET /{$}", c.serveConsole)
	mux.HandleFunc("GET /cutover", c.serveCutover)
	mux.HandleFunc("GET /console.css", serveAsset("console.css", "text/css; charset=utf-8"))
	mux.HandleFunc("GET /console.js", serveAsset("console.js", "text/javascript; charset=utf-8"))
}

// consolePage is what the "page" template lays out: the console or the
// cutover check.
type consolePage struct {
	Title, Table, Version string
	Refresh               int // seconds; 0: no refresh
	Console               *consoleView
	Cutover               *cutoverView
}

func (c *console) serveConsole(w http.ResponseWriter, r *http.Request) {
	data, _, err := c.page.get(r.Context())
	if r.Context().Err() != nil {
		return
	}
	if err != nil { // pageLoader reports its errors in data: a panic
		http.Error(w, "read the console's data: "+scrub(err.Error()), http.StatusInternalServerError)
		return
	}
	in := consoleInput{
		now: c.cfg.Now(), interval: c.cfg.Interval, table: c.cfg.Table.String(), self: c.cfg.Self,
		data: data, figures: c.cfg.Figures.snapshot(), phase: c.cfg.Relay.Phase(), unready: c.cfg.Relay.Unready(),
		groups: c.cfg.Groups,
	}
	if c.cfg.Health != nil {
		in.health, in.healthAt = c.cfg.Health()
	}
	v := buildConsoleView(in)
	c.render(w, r, consolePage{Title: "console", Refresh: v.Refresh, Console: &v}, "console", &v)
}

func (c *console) serveCutover(w http.ResponseWriter, r *http.Request) {
	var res cutover.Result
	var at time.Time
	var err error
	if c.check != nil {
		if res, at, err = c.check.get(r.Context()); r.Context().Err() != nil {
			return
		}
	}
	v := buildCutoverView(c.cfg.Now(), at, c.cfg.Groups, res, err)
	c.render(w, r, consolePage{Title: "cutover check", Cutover: &v}, "cutover", &v)
}

// render writes the whole page, or with ?part=main only its main element
// (console.js swaps it in).
func (c *console) render(w http.ResponseWriter, r *http.Request, p consolePage, main string, mainData any) {
	p.Table, p.Version = c.cfg.Table.String(), version
	var b bytes.Buffer
	var err error
	if r.URL.Query().Get("part") == "main" {
		err = consoleTemplates.ExecuteTemplate(&b, main, mainData)
	} else {
		err = consoleTemplates.ExecuteTemplate(&b, "page", p)
	}
	if err != nil {
		http.Error(w, "render the console: "+err.Error(), http.StatusInternalServerError)
		return
	}
	consoleHeaders(w, "text/html; charset=utf-8")
	w.Write(b.Bytes()) //nolint:errcheck // the viewer left
}

func serveAsset(name, contentType string) http.HandlerFunc {
	body, err := consoleFiles.ReadFile(name)
	if err != nil {
		panic(err) // embedded above
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		consoleHeaders(w, contentType)
		w.Write(body) //nolint:errcheck // the viewer left
	}
}

// consoleCSP lets the page load its own stylesheet and script and fetch its
// own fragment, nothing else, and not be framed.
const consoleCSP = "default-src 'none'; style-src 'self'; script-src 'self'; connect-src 'self'; img-src 'self'; " +
	"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func consoleHeaders(w http.ResponseWriter, contentType string) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", consoleCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}
