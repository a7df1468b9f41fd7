package upstairs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"tern/volume/ids"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// activation is what Activate and the replica goroutines share while the
// sessions are negotiated; guarded by Upstairs.mu.
type activation struct {
	gen ids.Generation
	// changed is closed (and replaced) whenever a replica reports.
	changed chan struct{}
	// proceed is closed when Activate has checked the regions and lets the
	// replicas send Activate.
	proceed chan struct{}
	// decided is set once Activate chose the replicas that take part.
	decided bool
	region  [engine.ReplicaCount]*wire.RegionInfo
	done    [engine.ReplicaCount]bool
	err     [engine.ReplicaCount]error
	// versions are the extent versions each replica reported.
	versions [engine.ReplicaCount][]wire.ExtentVersion
}

// Activate negotiates a session with every downstairs, checks that they
// serve the same region, and activates it with generation gen, which fences
// any upstairs that activated with a lower one. It waits up to
// Config.ActivationQuorumWait for all three, then goes ahead with two; a
// replica that missed the activation is faulted and brought back by live
// repair once it is reachable. Before guest IO starts, extents on which
// the replicas disagree are reconciled (reconcileActivation); progress is
// published from New on (ActivationProgress, SubscribeActivation) and
// its final value is always delivered. Replicas
// that disagree on the region's UUID or geometry make Activate fail with an
// error wrapping ErrRegionMismatch that names them.
func (u *Upstairs) Activate(ctx context.Context, gen ids.Generation) error {
	u.mu.Lock()
	switch {
	case u.closed:
		u.mu.Unlock()
		return fmt.Errorf("activating volume: %w", ErrClosed)
	case u.act != nil:
		u.mu.Unlock()
		return fmt.Errorf("activating volume: already activated")
	}
	a := &activation{gen: gen, changed: make(chan struct{}), proceed: make(chan struct{})}
	u.act, u.gen = a, gen
	u.started = true
	for _, r := range u.replicas {
		u.wg.Add(1)
		go r.run()
	}
	u.mu.Unlock()

	err := u.activate(ctx, a)
	if err != nil {
		u.actTracker.Fail(err)
		// Leave nothing running: an upstairs that failed to activate is
		// only good for Close.
		u.mu.Lock()
		u.eng.Stop(err)
		a.notifyLocked()
		u.stepLocked()
		u.finishLocked()
		u.cancel()
		return fmt.Errorf("activating volume: %w", err)
	}
	u.actTracker.Finish()
	return nil
}

func (u *Upstairs) activate(ctx context.Context, a *activation) error {
	quorumTimer := time.NewTimer(u.cfg.ActivationQuorumWait)
	defer quorumTimer.Stop()
	quorumWaited := false
	// Phase 1: sessions negotiated; regions compared.
	for {
		u.mu.Lock()
		n, fatal := a.countLocked(func(r int) bool { return a.region[r] != nil })
		if fatal != nil {
			u.mu.Unlock()
			return fatal
		}
		if n == engine.ReplicaCount || quorumWaited && n >= engine.Quorum {
			err := u.checkRegionsLocked(a)
			if err == nil {
				a.decided = true
				close(a.proceed)
			}
			u.mu.Unlock()
			if err != nil {
				return err
			}
			break
		}
		ch := a.changed
		u.mu.Unlock()
		select {
		case <-ch:
		case <-quorumTimer.C:
			quorumWaited = true
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// Phase 2: the replicas that negotiated activate with gen.
	for {
		u.mu.Lock()
		n, fatal := a.countLocked(func(r int) bool { return a.done[r] })
		if fatal != nil {
			u.mu.Unlock()
			return fatal
		}
		waiting := 0
		for r := range engine.ReplicaCount {
			if a.region[r] != nil && !a.done[r] && a.err[r] == nil {
				waiting++
			}
		}
		if waiting == 0 {
			u.mu.Unlock()
			if n < engine.Quorum {
				return fmt.Errorf("%d of %d replicas activated: %w", n, engine.ReplicaCount, ErrNotEnoughReplicas)
			}
			if err := u.reconcileActivation(ctx, a); err != nil {
				return err
			}
			u.mu.Lock()
			u.startIOLocked(a)
			u.mu.Unlock()
			return nil
		}
		ch := a.changed
		u.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// countLocked counts replicas for which ok holds, and returns a fencing or
// generation error any replica met, which ends the activation.
func (a *activation) countLocked(ok func(r int) bool) (int, error) {
	n := 0
	for r := range engine.ReplicaCount {
		if err := a.err[r]; errors.Is(err, ErrFenced) || errors.Is(err, ErrGenTooLow) || errors.Is(err, ErrRegionMismatch) {
			return 0, err
		}
		if ok(r) {
			n++
		}
	}
	return n, nil
}

// notifyLocked wakes Activate.
func (a *activation) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// checkRegionsLocked compares the regions of the replicas that negotiated
// with each other and with the configured region, naming every difference.
func (u *Upstairs) checkRegionsLocked(a *activation) error {
	var errs []error
	ref := -1
	for r := range engine.ReplicaCount {
		if a.region[r] == nil {
			continue
		}
		if want := u.cfg.Region; !regionMatchesConfig(*a.region[r], want) {
			errs = append(errs, fmt.Errorf("replica %d (%s): serves %s, configured %s",
				r, u.targets[r], describeRegion(*a.region[r]), describeRegion(want)))
			continue
		}
		if ref < 0 {
			ref = r
			continue
		}
		if d := regionDiff(*a.region[ref], *a.region[r]); d != "" {
			errs = append(errs, fmt.Errorf("replica %d (%s) and replica %d (%s): %s",
				ref, u.targets[ref], r, u.targets[r], d))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrRegionMismatch, errors.Join(errs...))
	}
	u.region = *a.region[ref]
	u.blockSize = int(u.region.BlockSize)
	return nil
}

func regionMatchesConfig(got, want wire.RegionInfo) bool {
	var zero [16]byte
	return (want.UUID == zero || want.UUID == got.UUID) &&
		(want.BlockSize == 0 || want.BlockSize == got.BlockSize) &&
		(want.ExtentBlocks == 0 || want.ExtentBlocks == got.ExtentBlocks) &&
		(want.ExtentCount == 0 || want.ExtentCount == got.ExtentCount)
}

// regionDiff names how b differs from a, or returns "".
func regionDiff(a, b wire.RegionInfo) string {
	switch {
	case a.UUID != b.UUID:
		return fmt.Sprintf("region uuid %s differs from %s", b.UUID, a.UUID)
	case a.BlockSize != b.BlockSize:
		return fmt.Sprintf("block size %d differs from %d", b.BlockSize, a.BlockSize)
	case a.ExtentBlocks != b.ExtentBlocks:
		return fmt.Sprintf("extent size %d blocks differs from %d", b.ExtentBlocks, a.ExtentBlocks)
	case a.ExtentCount != b.ExtentCount:
		return fmt.Sprintf("extent count %d differs from %d", b.ExtentCount, a.ExtentCount)
	}
	return ""
}

func describeRegion(r wire.RegionInfo) string {
	return fmt.Sprintf("region %s (%d-byte blocks, %d blocks per extent, %d extents)",
		r.UUID, r.BlockSize, r.ExtentBlocks, r.ExtentCount)
}

// startIOLocked turns the activation into running IO: replicas that
// activated are Active, the rest Faulted; flush numbers continue after the
// highest any replica has.
func (u *Upstairs) startIOLocked(a *activation) {
	var active [engine.ReplicaCount]bool
	var maxFlush uint64
	for r := range engine.ReplicaCount {
		active[r] = a.done[r]
		for _, v := range a.versions[r] {
			maxFlush = max(maxFlush, v.Flush)
		}
	}
	u.eng.SetExtentBlocks(u.region.ExtentBlocks)
	for r, rep := range u.replicas {
		if !active[r] {
			rep.cause = fmt.Errorf("replica %d missed the activation", r)
			if err := cmp.Or(a.err[r], rep.lastErr); err != nil {
				rep.cause = fmt.Errorf("replica %d missed the activation: %w", r, err)
			}
		}
	}
	u.eng.Activate(active, maxFlush+1)
	a.notifyLocked() // replicas waiting in activated go on to serve IO
	u.stepLocked()
	for _, rep := range u.replicas {
		rep.cause = nil
	}
	for r := range engine.ReplicaCount {
		if a.done[r] {
			u.log.Info("replica active", "replica", r, "target", u.targets[r], "gen", a.gen)
		}
	}
}
