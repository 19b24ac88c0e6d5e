package main

import (
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progressLine shows a long command's progress: a bar on a terminal, a log
// line every progressLogEvery otherwise. Not safe for concurrent use: its
// owner locks.
type progressLine struct {
	what    string
	bar     *progressbar.ProgressBar
	log     *slog.Logger
	logNext time.Time
}

const progressLogEvery = 5 * time.Second

func newProgressLine(w io.Writer, log *slog.Logger, what string) progressLine {
	p := progressLine{what: what, log: log, logNext: time.Now().Add(progressLogEvery)}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(w), progressbar.OptionSetDescription(what),
			progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString("msg"),
			progressbar.OptionSetPredictTime(true), progressbar.OptionThrottle(100*time.Millisecond), progressbar.OptionClearOnFinish())
	}
	return p
}

// show moves the bar to done of total (unknown when total <= 0), or logs
// attrs when the last line is old enough.
func (p *progressLine) show(done, total int64, attrs ...any) {
	if p.bar != nil {
		if total > 0 && p.bar.GetMax64() != total {
			p.bar.ChangeMax64(total)
		}
		p.bar.Set64(done) //nolint:errcheck // display only
		return
	}
	if now := time.Now(); now.After(p.logNext) {
		p.logNext = now.Add(progressLogEvery)
		p.log.Info(p.what+" progress", attrs...)
	}
}

func (p *progressLine) finish() {
	if p.bar != nil {
		p.bar.Finish() //nolint:errcheck // display only
	}
}
