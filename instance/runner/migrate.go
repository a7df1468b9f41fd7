package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"tern/instance/apiv1"
	"tern/instance/client"
)

// MigrationInit is the init of a migration target's ensure.
type MigrationInit struct {
	Method           string `json:"method"`
	Source           string `json:"source"`
	MigrationID      string `json:"migration_id"`
	DowntimeTargetMs uint64 `json:"downtime_target_ms,omitempty"`
	SameHost         bool   `json:"same_host,omitempty"`
}

// MigrationTargetSpec is the body that ensures a migration target: the
// source's id, the init, and optionally disks (backends replacing the
// source's) and the target's own components.
type MigrationTargetSpec struct {
	ID         string                         `json:"id"`
	Init       MigrationInit                  `json:"init"`
	Disks      []apiv1.DiskSpec               `json:"disks,omitempty"`
	Components map[string]apiv1.ComponentSpec `json:"components,omitempty"`
}

// CheckMigrationVersions returns nil when a source answering src to
// GET /v1/version can migrate to a target answering dst: they share a
// migration protocol, and the target reads the version the source writes
// (its newest) of every device state kind. Otherwise the error names
// every difference.
func CheckMigrationVersions(src, dst apiv1.Version) error {
	var problems []error
	common := false
	for _, v := range src.MigrationProtocols {
		common = common || slices.Contains(dst.MigrationProtocols, v)
	}
	if !common {
		problems = append(problems, fmt.Errorf("no common migration protocol: the source speaks %v, the target %v",
			src.MigrationProtocols, dst.MigrationProtocols))
	}
	kinds := make([]string, 0, len(src.Devices))
	for kind := range src.Devices {
		kinds = append(kinds, kind)
	}
	slices.Sort(kinds)
	for _, kind := range kinds {
		versions := src.Devices[kind]
		if len(versions) == 0 {
			continue
		}
		written := slices.Max(versions)
		read, ok := dst.Devices[kind]
		switch {
		case !ok:
			problems = append(problems, fmt.Errorf("device %s: the target does not read this kind (the source writes version %d)", kind, written))
		case !slices.Contains(read, written):
			problems = append(problems, fmt.Errorf("device %s: the source writes version %d, the target reads %v", kind, written, read))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %w", ErrIncompatible, errors.Join(problems...))
	}
	return nil
}

// ErrIncompatible wraps CheckMigrationVersions's differences.
var ErrIncompatible = errors.New("source and target cannot migrate")

// MigrateOptions configure Migrate.
type MigrateOptions struct {
	// DowntimeTarget is the longest pause the source aims for (0: the
	// server's default, 30 ms).
	DowntimeTarget time.Duration
	// SameHost asks for the same-host path (memory passed as memfds).
	SameHost bool
	// Disks and Components go into the target's ensure as they are.
	Disks      []apiv1.DiskSpec
	Components map[string]apiv1.ComponentSpec
	// StallTimeout bounds the wait for the next snapshot from either
	// side (default DefaultStallTimeout).
	StallTimeout time.Duration
	// Progress, when set, gets every snapshot of either side as it comes,
	// from the one goroutine that called Migrate.
	Progress func(MigrationEvent)
}

// DefaultStallTimeout is how long Migrate waits for either side to publish
// anything before it gives up.
const DefaultStallTimeout = 2 * time.Minute

// Side names a migration's end.
type Side string

// The two sides.
const (
	SideSource Side = "source"
	SideTarget Side = "target"
)

// MigrationEvent is one published view of one side. Progress is the side's
// direction (out on the source, in on the target), nil until it has one.
type MigrationEvent struct {
	Side     Side
	View     apiv1.View
	Progress *apiv1.Progress
}

// MigrationResult is a finished migration's figures: bytes and rounds
// from the source's migration.out, total and downtime from the source's
// too, the target's migration.in standing in for what it lacks. The
// pause breakdown is the source's (every part), or the target's (its own
// parts) when the source's final view was not seen.
type MigrationResult struct {
	ID             string                `json:"migration_id"`
	TotalMs        float64               `json:"total_ms"`
	DowntimeMs     float64               `json:"downtime_ms"`
	BytesSent      uint64                `json:"bytes_sent"`
	Rounds         uint64                `json:"rounds"`
	PauseBreakdown *apiv1.PauseBreakdown `json:"pause_breakdown,omitempty"`
}

// MigrationError is a failed migration: the side that reported it, the
// last phase it reached before error, and the reason.
type MigrationError struct {
	Side   Side
	Phase  apiv1.Phase
	Reason string
}

func (e *MigrationError) Error() string {
	phase := "before any phase"
	if e.Phase != 0 {
		phase = "in phase " + e.Phase.String()
	}
	return fmt.Sprintf("migration failed %s (%s): %s", phase, e.Side, e.Reason)
}

// Migrate moves the instance of src to dst: it compares their versions,
// ensures dst as a migration target of src, and follows both monitors
// until the target runs and the source is destroyed (nil), or either
// reports a failure (*MigrationError), or nothing is published for
// StallTimeout.
func Migrate(ctx context.Context, src, dst *client.Client, opts MigrateOptions) (MigrationResult, error) {
	// Each request before the monitors is bounded by RequestWait.
	rctx, cancel := context.WithTimeout(ctx, RequestWait)
	defer cancel()
	res, err := startMigration(rctx, src, dst, opts)
	if err != nil {
		if rctx.Err() != nil && ctx.Err() == nil {
			err = fmt.Errorf("%w (no answer within %v)", err, RequestWait)
		}
		return MigrationResult{}, err
	}
	return followMigration(ctx, src, dst, res.id, res.srcGen, opts)
}

// RequestWait bounds the requests that start a migration (versions, the
// source's instance, the target's ensure).
const RequestWait = time.Minute

// startedMigration is what following a migration needs.
type startedMigration struct {
	id     string
	srcGen apiv1.ViewGen
}

// startMigration compares the versions and ensures the target.
func startMigration(ctx context.Context, src, dst *client.Client, opts MigrateOptions) (startedMigration, error) {
	sv, err := src.Version(ctx)
	if err != nil {
		return startedMigration{}, fmt.Errorf("getting the source's version: %w", err)
	}
	dv, err := dst.Version(ctx)
	if err != nil {
		return startedMigration{}, fmt.Errorf("getting the target's version: %w", err)
	}
	if err := CheckMigrationVersions(sv, dv); err != nil {
		return startedMigration{}, err
	}
	view, err := src.Get(ctx)
	if err != nil {
		return startedMigration{}, fmt.Errorf("getting the source instance: %w", err)
	}
	if view.MigrationAddr == "" {
		return startedMigration{}, fmt.Errorf("the source %s reports no migration_addr", src.Base())
	}
	id, err := newMigrationID()
	if err != nil {
		return startedMigration{}, err
	}
	spec := MigrationTargetSpec{
		ID: view.ID,
		Init: MigrationInit{Method: apiv1.InitMigrationTarget, Source: view.MigrationAddr, MigrationID: id,
			DowntimeTargetMs: uint64(opts.DowntimeTarget.Milliseconds()), SameHost: opts.SameHost},
		Disks: opts.Disks, Components: opts.Components,
	}
	body, err := json.Marshal(spec)
	if err != nil {
		return startedMigration{}, fmt.Errorf("encoding the target's spec: %w", err)
	}
	if _, err := dst.EnsureRaw(ctx, body); err != nil {
		return startedMigration{}, fmt.Errorf("ensuring the migration target: %w", err)
	}
	return startedMigration{id: id, srcGen: view.Gen}, nil
}

func newMigrationID() (string, error) {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("making a migration id: %w", err)
	}
	return "mig-" + hex.EncodeToString(b), nil
}

// sideEvent is one monitor answer of one side.
type sideEvent struct {
	side Side
	snap apiv1.View
	err  error
}

// watchSide long-polls c's monitor from afterGen and sends each new
// snapshot, then its final error, to events until ctx ends.
func watchSide(ctx context.Context, c *client.Client, side Side, afterGen apiv1.ViewGen, events chan<- sideEvent) {
	for {
		s, err := c.Monitor(ctx, afterGen)
		if err == nil && s.Gen <= afterGen {
			continue // the server's long-poll ran out: ask again
		}
		select {
		case events <- sideEvent{side: side, snap: s, err: err}:
		case <-ctx.Done():
			return
		}
		if err != nil {
			return
		}
		afterGen = s.Gen
	}
}

// migrationWatch is what followMigration learnt of both sides so far.
type migrationWatch struct {
	id string
	// last snapshot and last phase before error, per side
	src, dst           *apiv1.View
	srcPhase, dstPhase apiv1.Phase
	srcGone            bool
}

// progress returns side's direction of the migration id in s, if any.
func (w *migrationWatch) progress(side Side, s *apiv1.View) *apiv1.Progress {
	if s == nil {
		return nil
	}
	p := s.Migration.Out
	if side == SideTarget {
		p = s.Migration.In
	}
	if !p.Active() || p.ID != w.id {
		return nil
	}
	return &p
}

// decide returns done once the migration succeeded, or a *MigrationError
// once either side reported failure.
func (w *migrationWatch) decide() (done bool, err error) {
	sp, dp := w.progress(SideSource, w.src), w.progress(SideTarget, w.dst)
	if sp != nil && sp.Phase == apiv1.PhaseError {
		return false, &MigrationError{Side: SideSource, Phase: w.srcPhase, Reason: reason(sp.Error)}
	}
	if dp != nil && dp.Phase == apiv1.PhaseError || w.dst != nil && w.dst.State == apiv1.Failed {
		r := ""
		if dp != nil {
			r = dp.Error
		}
		return false, &MigrationError{Side: SideTarget, Phase: w.dstPhase, Reason: reason(r)}
	}
	targetRuns := w.dst != nil && w.dst.State == apiv1.Running && dp != nil && dp.Phase == apiv1.PhaseFinish
	sourceGone := w.srcGone || w.src != nil && w.src.State == apiv1.Destroyed
	return targetRuns && sourceGone, nil
}

func reason(s string) string {
	if s == "" {
		return "no reason given"
	}
	return s
}

// result reads the figures off the target's finish (the source's as a
// fallback).
func (w *migrationWatch) result() MigrationResult {
	r := MigrationResult{ID: w.id}
	// The target's last: its figures win where both have them. Rounds
	// and bytes are the source's (the target counts the paused copy as a
	// round of its own).
	for _, p := range []*apiv1.Progress{w.progress(SideTarget, w.dst), w.progress(SideSource, w.src)} {
		if p == nil {
			continue
		}
		r.BytesSent, r.Rounds = p.BytesSent, uint64(p.Round)
		// Absent (zero) until finish: the other side's figure stands.
		if p.TotalMs != 0 {
			r.TotalMs = p.TotalMs
		}
		if p.DowntimeMs != 0 {
			r.DowntimeMs = p.DowntimeMs
		}
		if p.PauseBreakdown != (apiv1.PauseBreakdown{}) {
			b := p.PauseBreakdown
			r.PauseBreakdown = &b
		}
	}
	return r
}

// followMigration follows both monitors (the source's from srcGen, the
// target's from its start) until decide ends it.
func followMigration(ctx context.Context, src, dst *client.Client, id string, srcGen apiv1.ViewGen, opts MigrateOptions) (MigrationResult, error) {
	stall := opts.StallTimeout
	if stall <= 0 {
		stall = DefaultStallTimeout
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := make(chan sideEvent)
	go watchSide(ctx, src, SideSource, srcGen, events)
	go watchSide(ctx, dst, SideTarget, 0, events)
	w := &migrationWatch{id: id}
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for {
		var ev sideEvent
		select {
		case ev = <-events:
		case <-timer.C:
			return w.result(), fmt.Errorf("waiting for migration progress: nothing published by either side for %v (source phase %v, target phase %v)",
				stall, phaseOrNone(w.srcPhase), phaseOrNone(w.dstPhase))
		case <-ctx.Done():
			return w.result(), fmt.Errorf("waiting for the migration: %w", ctx.Err())
		}
		timer.Reset(stall)
		if ev.err != nil {
			switch {
			case ev.side == SideSource && client.IsCode(ev.err, apiv1.CodeInstanceGone):
				w.srcGone = true
			case client.IsCode(ev.err, apiv1.CodeInstanceGone):
				// A target that is gone does not run, whatever it reached.
				return w.result(), &MigrationError{Side: SideTarget, Phase: w.dstPhase, Reason: "the target instance is gone: " + ev.err.Error()}
			default:
				return w.result(), fmt.Errorf("following the %s's monitor: %w", ev.side, ev.err)
			}
		} else {
			snap := ev.snap
			if ev.side == SideSource {
				w.src = &snap
			} else {
				w.dst = &snap
			}
			p := w.progress(ev.side, &snap)
			if p != nil && p.Phase != apiv1.PhaseError {
				if ev.side == SideSource {
					w.srcPhase = p.Phase
				} else {
					w.dstPhase = p.Phase
				}
			}
			if opts.Progress != nil {
				opts.Progress(MigrationEvent{Side: ev.side, View: snap, Progress: p})
			}
		}
		done, err := w.decide()
		if err != nil {
			return w.result(), err
		}
		if done {
			return w.result(), nil
		}
		if w.srcGone && (w.dst == nil || w.dst.State != apiv1.Migrating && w.dst.State != apiv1.Running) {
			return w.result(), &MigrationError{Side: SideSource, Phase: w.srcPhase, Reason: "the source instance is gone but the target does not run"}
		}
	}
}

func phaseOrNone(p apiv1.Phase) string {
	if p == 0 {
		return "none"
	}
	return p.String()
}
