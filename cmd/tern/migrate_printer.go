package main

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/schollz/progressbar/v3"

	"tern/instance/apiv1"
	"tern/instance/runner"
	"tern/internal/units"
)

// migratePrinter shows a migration's events as tern migrate prints them: a
// progress bar on a terminal, JSON lines otherwise ({"side","gen","state",
// "migration"} per event, then {"result": …}).
type migratePrinter struct {
	out   io.Writer
	isTTY bool
	enc   *json.Encoder
	bar   *progressbar.ProgressBar
	// lastPhase is the phase last described, per side, on a terminal.
	lastPhase map[runner.Side]string
}

// newMigratePrinter returns a printer writing to out, a terminal when
// isTTY.
func newMigratePrinter(out io.Writer, isTTY bool) *migratePrinter {
	return &migratePrinter{out: out, isTTY: isTTY, enc: json.NewEncoder(out), lastPhase: map[runner.Side]string{}}
}

// eventLine is one JSON line of a non-terminal migrate.
type eventLine struct {
	Side      runner.Side     `json:"side"`
	Gen       apiv1.ViewGen   `json:"gen"`
	State     string          `json:"state"`
	Migration *apiv1.Progress `json:"migration"`
}

// Event shows one event; it is a runner.MigrateOptions.Progress.
func (p *migratePrinter) Event(ev runner.MigrationEvent) {
	if !p.isTTY {
		p.enc.Encode(eventLine{Side: ev.Side, Gen: ev.View.Gen, State: ev.View.State.String(), Migration: ev.Progress})
		return
	}
	m := ev.Progress
	if ev.Side != runner.SideSource || m == nil {
		if ev.Side == runner.SideTarget && p.lastPhase[ev.Side] != ev.View.State.String() {
			p.lastPhase[ev.Side] = ev.View.State.String()
			p.println(fmt.Sprintf("target: %s", ev.View.State))
		}
		return
	}
	if p.bar == nil {
		p.bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(p.out), progressbar.OptionShowBytes(true),
			progressbar.OptionSetWidth(20))
	}
	p.bar.Describe(fmt.Sprintf("%s round %d, %s left, est. downtime %.1f ms", m.Phase, m.Round,
		units.Bytes(m.PagesRemaining*4096), m.EstimatedDowntimeMs))
	p.bar.Set64(int64(m.BytesSent))
}

func (p *migratePrinter) println(s string) {
	if p.bar != nil {
		p.bar.Clear()
	}
	fmt.Fprintln(p.out, s)
}

// Finish ends the progress bar, if one was drawn.
func (p *migratePrinter) Finish() {
	if p.bar != nil {
		p.bar.Finish()
		fmt.Fprintln(p.out)
	}
}

// Result prints the finished migration's figures.
func (p *migratePrinter) Result(r runner.MigrationResult) error {
	if !p.isTTY {
		return p.enc.Encode(map[string]runner.MigrationResult{"result": r})
	}
	_, err := fmt.Fprintf(p.out, "migrated: total %.1f ms, downtime %.1f ms, %s sent (%d bytes), %d rounds\n",
		r.TotalMs, r.DowntimeMs, units.Bytes(r.BytesSent), r.BytesSent, r.Rounds)
	return err
}
