package migration

import (
	"time"

	"tern/instance/apiv1"
)

// pauseTimer splits the source's pause into consecutive stretches of its
// own clock: each lap ends the stretch since the previous one and adds it
// to a part of the breakdown, or to none (skip: a wait the target's parts
// fall into, or a phase announcement), which OtherUs then holds. Each
// stretch is truncated to whole microseconds, so the parts never sum to
// more than the truncated total.
type pauseTimer struct {
	start, last time.Time
	b           apiv1.PauseBreakdown
}

// begin starts the pause at t.
func (p *pauseTimer) begin(t time.Time) { p.start, p.last = t, t }

// lap adds the stretch since the last lap to *part.
func (p *pauseTimer) lap(part *int64) {
	now := time.Now()
	*part += now.Sub(p.last).Microseconds()
	p.last = now
}

// skip ends the stretch since the last lap without adding it to a part.
func (p *pauseTimer) skip() { p.last = time.Now() }

// end closes the pause at t with the target's parts and returns the
// breakdown and the pause.
func (p *pauseTimer) end(t time.Time, target targetTimes) (apiv1.PauseBreakdown, time.Duration) {
	total := t.Sub(p.start)
	b := p.b
	b.RestoreUs, b.ResumeUs = target.Restore.Microseconds(), target.Resume.Microseconds()
	b.TotalUs = total.Microseconds()
	b.OtherUs = b.TotalUs - b.PartsUs()
	return b, total
}
