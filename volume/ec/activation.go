package ec

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// ErrActivation: fewer than Layout.Data shards could be activated.
var ErrActivation = errors.New("too few shards to activate")

// Activate connects to every shard and activates them with gen, which
// fences every lower generation. It waits for all of them, or after
// Config.ActivationQuorumWait goes ahead with at least Layout.Data; a
// shard left out is named in the error or, if the volume activates
// without it, in Status, and joins later (repaired where it is behind).
// Before IO starts, every extent whose versions differ between shards or
// that is dirty on one is reconciled stripe by stripe (Codec.Resolve),
// with the activation's progress published (SubscribeActivation).
func (v *Volume) Activate(ctx context.Context, gen ids.Generation) error {
	if err := v.activate(ctx, gen); err != nil {
		v.actTracker.Fail(err)
		return err
	}
	v.actTracker.Finish()
	return nil
}

func (v *Volume) activate(ctx context.Context, gen ids.Generation) error {
	n, k := v.cfg.Layout.Shards(), v.cfg.Layout.Data
	v.mu.Lock()
	if v.started {
		v.mu.Unlock()
		return errors.New("activating volume: already activated")
	}
	v.started, v.gen = true, gen
	a := &activation{
		region: make([]*wire.RegionInfo, n), err: make([]error, n), include: make([]bool, n),
		proceed: make(chan struct{}), done: make([]*session, n), failed: make([]error, n),
		changed: make(chan struct{}),
	}
	v.act = a
	v.mu.Unlock()
	for i := range v.shards {
		v.wg.Add(1)
		go v.runShard(i)
	}
	quorumAt := time.Now().Add(v.cfg.ActivationQuorumWait)
	quorumTimer := time.NewTimer(v.cfg.ActivationQuorumWait)
	defer quorumTimer.Stop()

	// Negotiate: wait for every hello, or Data of them after the wait.
	v.mu.Lock()
	for {
		answered := 0
		for _, r := range a.region {
			if r != nil {
				answered++
			}
		}
		if answered == n || answered >= k && !time.Now().Before(quorumAt) {
			break
		}
		ch := a.changed
		v.mu.Unlock()
		select {
		case <-ch:
		case <-quorumTimer.C:
		case <-ctx.Done():
			v.mu.Lock()
			why := v.missingLocked(func(i int) bool { return a.region[i] == nil }, a.err)
			v.mu.Unlock()
			return fmt.Errorf("activating volume: %w (%d shards needed): %s: %w", ErrActivation, k, why, ctx.Err())
		}
		v.mu.Lock()
	}
	var region wire.RegionInfo
	for i, r := range a.region {
		if r == nil {
			continue
		}
		if region.BlockSize == 0 {
			region = *r
		} else if d := regionDiff(region, *r); d != "" {
			v.mu.Unlock()
			return fmt.Errorf("activating volume: shard %d: %s: %w", i, d, ErrRegionMismatch)
		}
		a.include[i] = true
	}
	if err := (extent.Spec{UUID: region.UUID, BlockSize: region.BlockSize, ExtentBlocks: region.ExtentBlocks,
		ExtentCount: region.ExtentCount, FormatVersion: extent.FormatVersion1}).Validate(); err != nil {
		v.mu.Unlock()
		return fmt.Errorf("activating volume: shards serve an invalid region: %w", err)
	}
	v.region, v.bs = region, int(region.BlockSize)
	v.stripes, v.metaBlock = region.Blocks()-1, StripeIndex(region.Blocks()-1)
	for _, sh := range v.shards {
		sh.missed = newStripeSet(region.Blocks())
		sh.held = newStripeSet(uint64(region.ExtentCount))
	}
	a.decided = true
	close(a.proceed)
	a.notifyLocked()

	// Activate the included shards; those that fail are left out.
	for {
		pending, ok := 0, 0
		for i := range n {
			switch {
			case !a.include[i]:
			case a.done[i] != nil:
				ok++
			case a.failed[i] != nil:
			default:
				pending++
			}
		}
		if pending == 0 {
			if ok < k {
				why := v.missingLocked(func(i int) bool { return a.done[i] == nil }, a.failed)
				v.mu.Unlock()
				return fmt.Errorf("activating volume: %w: %d of %d activated, %d needed: %s", ErrActivation, ok, n, k, why)
			}
			break
		}
		for _, e := range a.failed {
			if errors.Is(e, ErrFenced) || errors.Is(e, ErrGenTooLow) {
				v.mu.Unlock()
				return fmt.Errorf("activating volume: %w", e)
			}
		}
		ch := a.changed
		v.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("activating volume: %w", ctx.Err())
		}
		v.mu.Lock()
	}
	a.collected = true
	for i, s := range a.done {
		if s != nil {
			v.shards[i].sess, v.shards[i].attachedOnce = s, true
			v.shards[i].sessions++
		}
	}
	v.refVersions, v.flushNum = referenceVersions(a.done, int(region.ExtentCount))
	v.mu.Unlock()
	_ = v.actTracker.SetPhase(reconcile.PhaseComparing)
	metas := make([]uint64, n)
	left := 0
	for i, s := range a.done {
		if s == nil {
			continue
		}
		m, err := v.readMeta(ctx, i, s)
		switch {
		case errors.Is(err, ErrRegionMismatch):
			return fmt.Errorf("activating volume: %w", err)
		case err != nil:
			// Lost on the way: the volume goes on without it, and it
			// joins later like a shard that missed the activation.
			v.log.Warn("shard lost during activation", "shard", i, "err", err)
			s.close("lost during activation")
			v.mu.Lock()
			v.shards[i].sess, v.shards[i].attachedOnce = nil, false
			v.shards[i].lastErr = err.Error()
			v.mu.Unlock()
			a.done[i] = nil
			continue
		}
		metas[i] = m
		left++
	}
	if left < k {
		return fmt.Errorf("activating volume: %w: %d shards left after reading their metadata, %d needed", ErrActivation, left, k)
	}
	v.mu.Lock()
	for _, m := range metas {
		v.refMeta = max(v.refMeta, m)
		v.flushNum = max(v.flushNum, m)
	}
	v.mu.Unlock()
	if err := v.reconcileAtActivation(ctx, a.done, metas); err != nil {
		return fmt.Errorf("activating volume: %w", err)
	}
	v.mu.Lock()
	v.running = true
	v.notifyLocked()
	v.mu.Unlock()
	return nil
}

// missingLocked names each shard pick selects with its reason, on one
// line.
func (v *Volume) missingLocked(pick func(int) bool, why []error) string {
	var out []string
	for i, sh := range v.shards {
		if !pick(i) {
			continue
		}
		reason := "no answer"
		if why[i] != nil {
			reason = why[i].Error()
		} else if sh.lastErr != "" {
			reason = sh.lastErr
		}
		out = append(out, fmt.Sprintf("shard %d (%s): %s", i, sh.target, reason))
	}
	return strings.Join(out, "; ")
}

// referenceVersions is each extent's greatest version among the
// activated shards, and the flush number to continue from.
func referenceVersions(sessions []*session, extents int) ([]wire.ExtentVersion, uint64) {
	ref := make([]wire.ExtentVersion, extents)
	var flush uint64
	for _, s := range sessions {
		if s == nil {
			continue
		}
		for e, ver := range s.versions {
			if newer(ver, ref[e]) {
				ref[e] = ver
			}
			flush = max(flush, ver.Flush)
		}
	}
	return ref, flush
}

// newer reports whether a is a later version than b. Flush numbers grow
// across generations (each activation continues from the greatest), so
// the generation only breaks ties.
func newer(a, b wire.ExtentVersion) bool {
	if a.Flush != b.Flush {
		return a.Flush > b.Flush
	}
	return a.Gen > b.Gen
}

// reconcileAtActivation resolves every stripe of each extent that a shard
// may be behind on, or that is dirty on one. A shard is behind on an
// extent a peer stamped with a later flush than the last one its
// metadata names (it missed that flush, and the writes before it): it is
// a suspect there, its blocks reconstructed from the others and
// rewritten where they differ. A dirty extent is checked for a torn
// stripe (an upstairs that stopped in the middle of a write). Extent
// versions alone say nothing here: a flush stamps only the extents it
// covers, so shards of one stripe carry different ones.
func (v *Volume) reconcileAtActivation(ctx context.Context, sessions []*session, metas []uint64) error {
	v.mu.Lock()
	eb := uint64(v.region.ExtentBlocks)
	extents := len(v.refVersions)
	var todo []int
	suspects := make([][]bool, extents)
	for e := range extents {
		diff := false
		sus := make([]bool, len(sessions))
		for i, s := range sessions {
			if s == nil {
				continue
			}
			sus[i] = v.refVersions[e].Flush > metas[i]
			if s.versions[e].Dirty || sus[i] {
				diff = true
			}
		}
		if diff {
			todo = append(todo, e)
			suspects[e] = sus
		}
	}
	v.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	_ = v.actTracker.SetPhase(reconcile.PhaseRepairing)
	v.actTracker.GrowTotals(uint64(len(todo)), 0)
	for _, e := range todo {
		first := StripeIndex(uint64(e) * eb)
		last := min(first+StripeIndex(eb), StripeIndex(v.stripes)) - 1
		sus := suspects[e]
		if _, err := v.resolveRange(ctx, first, last, sus, v.actTracker); err != nil {
			return fmt.Errorf("reconciling extent %d: %w", e, err)
		}
		v.actTracker.ExtentDone()
	}
	return v.Flush(ctx)
}

// SubscribeActivation streams the activation's progress; see
// reconcile.Tracker.Subscribe.
func (v *Volume) SubscribeActivation(buffer int) (<-chan reconcile.Progress, func()) {
	return v.actTracker.Subscribe(buffer)
}
