package upstairs

import (
	"context"
	"fmt"
	"slices"
	"time"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// reconcileActivation runs after the replicas taking part in an activation
// have activated their sessions (a.done says which; a.versions holds the
// extent versions each reported) and before guest IO starts. It plans the
// repair with reconcile.PlanActivation and carries it out extent by
// extent over the replicas' sessions (the upstairs reads from the source
// and writes to the destinations; replicas never talk to each other):
//
//  1. A dirty source is stamped first with the plan's Target. If it stays
//     dirty, it holds corrupt (torn) blocks: each is taken from the first
//     of the plan's Donors holding it intact and written to the source
//     (mendSource), or the extent fails with a *CorruptBlockError.
//  2. For each destination, the source's and its block hashes are compared
//     and only the blocks that differ are copied (every block with
//     Config.RepairWholeExtents), then the destination takes Target.
//
// An extent is stamped only once its blocks are in place, so an
// interruption leaves each extent untouched or repaired (a partial
// destination is dirty and below the source), and a later activation
// finishes. Any error fails Activate.
func (u *Upstairs) reconcileActivation(ctx context.Context, a *activation) error {
	start := time.Now()
	defer u.repairRan(repairActivation, start)
	t := u.actTracker
	_ = t.SetPhase(reconcile.PhaseComparing)

	u.mu.Lock()
	var present []reconcile.ReplicaVersions
	var epochs [engine.ReplicaCount]uint64
	for r := range engine.ReplicaCount {
		if !a.done[r] {
			continue
		}
		epochs[r] = u.replicas[r].epoch
		vs := make([]reconcile.Version, len(a.versions[r]))
		for i, v := range a.versions[r] {
			vs[i] = fromWireVersion(v)
		}
		present = append(present, reconcile.ReplicaVersions{Replica: reconcile.ReplicaID(r), Extents: vs})
	}
	u.mu.Unlock()

	plan, err := reconcile.PlanActivation(a.gen, present)
	if err != nil {
		return err
	}
	t.GrowTotals(uint64(len(plan.Extents)), 0)
	_ = t.SetPhase(reconcile.PhaseRepairing)
	if len(plan.Extents) > 0 {
		u.log.Info("activation repair planned", "extents", len(plan.Extents), "copies", plan.Copies,
			"whole_extents", u.cfg.RepairWholeExtents)
	}
	versions := make(map[reconcile.ReplicaID][]reconcile.Version, len(present))
	for _, p := range present {
		versions[p.Replica] = p.Extents
	}
	for _, rep := range plan.Extents {
		if err := u.repairPlannedExtent(ctx, t, rep, versions, epochs, false); err != nil {
			return fmt.Errorf("repairing extent %d: %w", rep.Extent, err)
		}
		t.ExtentDone()
		u.extentRepaired(repairActivation)
		if u.hooks != nil && u.hooks.activationExtentDone != nil {
			u.hooks.activationExtentDone(ids.ExtentID(rep.Extent))
		}
	}
	if len(plan.Extents) > 0 {
		s := u.RepairStats()
		u.log.Info("activation repair done", "extents", len(plan.Extents), "blocks_copied", s.BlocksCopied,
			"bytes_copied", s.BytesCopied, "seconds", time.Since(start).Seconds())
	}
	return nil
}

// repairPlannedExtent carries out one extent of an activation (or
// restart) plan, publishing its progress on t. With zeroLost, a torn
// block no replica holds intact is zeroed instead of failing (mendSource).
func (u *Upstairs) repairPlannedExtent(ctx context.Context, t *reconcile.Tracker, rep reconcile.ExtentRepair,
	versions map[reconcile.ReplicaID][]reconcile.Version, epochs [engine.ReplicaCount]uint64, zeroLost bool) error {
	e := ids.ExtentID(rep.Extent)
	src := int(rep.Source)
	target := toWireVersion(rep.Target)
	if rep.SourceNeedsStamp() {
		// The source's blocks, as they stand, become the truth at a
		// version nobody else holds.
		if err := u.stamp(ctx, src, epochs[src], &wire.RepairWrite{Extent: e, Version: target}); err != nil {
			return err
		}
	}
	// The source's version as it now stands: still dirty after the stamp
	// only if it holds corrupt blocks.
	var srcV wire.ExtentVersion
	var srcHashes []uint64
	switch {
	case !u.cfg.RepairWholeExtents && len(rep.Dests) > 0:
		h, err := u.extentHashes(ctx, src, epochs[src], e)
		if err != nil {
			return err
		}
		srcV, srcHashes = h.Version, h.Hashes
	case rep.SourceNeedsStamp():
		v, err := u.extentVersion(ctx, src, epochs[src], e)
		if err != nil {
			return err
		}
		srcV = v
	}
	if srcV.Dirty {
		if err := u.mendSource(ctx, t, rep, epochs, srcV, srcHashes, zeroLost); err != nil {
			return err
		}
	}
	for _, d := range rep.Dests {
		dst := int(d)
		var dstHashes []uint64
		if !u.cfg.RepairWholeExtents {
			h, err := u.extentHashes(ctx, dst, epochs[dst], e)
			if err != nil {
				return err
			}
			dstHashes = h.Hashes
		}
		blocks, err := u.blocksToCopy(srcHashes, dstHashes, t)
		if err != nil {
			return err
		}
		t.GrowTotals(0, uint64(len(blocks))*uint64(u.blockSize))
		interim := versions[d][rep.Extent]
		interim.Dirty = true
		err = u.copyExtent(ctx, extentCopy{
			kind: repairActivation, extent: e, src: src, dst: dst,
			srcEpoch: epochs[src], dstEpoch: epochs[dst],
			blocks: blocks, interim: toWireVersion(interim), final: target, tracker: t,
		})
		mends, mended := 0, false
		for err != nil && servedBadData(err) && srcHashes != nil && reconcile.MendSourceAgain(!srcV.Dirty, mends, mended) {
			// The source's data does not match the hashes it recorded
			// (a bit flipped at rest goes unseen in a clean extent):
			// mend those blocks from replicas that recorded the same
			// hashes, then copy again. A block damaged again after its
			// mend is mended again (MendSourceAgain bounds how often).
			u.log.Warn("activation repair source served bad data; mending it from its peers",
				"extent", e, "source", src, "mends", mends, "err", err)
			n, merr := u.mendCleanSource(ctx, rep, versions, epochs, srcV, srcHashes, blocks, zeroLost)
			if merr != nil {
				return merr
			}
			mends, mended = mends+1, n > 0
			if u.hooks != nil && u.hooks.sourceMended != nil {
				u.hooks.sourceMended(src, e)
			}
			err = u.copyExtent(ctx, extentCopy{
				kind: repairActivation, extent: e, src: src, dst: dst,
				srcEpoch: epochs[src], dstEpoch: epochs[dst],
				blocks: blocks, interim: toWireVersion(interim), final: target, tracker: t,
			})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// mendCleanSource rewrites the blocks of rep's clean source, among
// blocks, whose data no longer matches the hash the source recorded for
// them, with the intact copy of a present replica that recorded the same
// hash (so holds the same data), or failing that, with any intact copy (a
// block no peer recorded alike was never acknowledged by two replicas).
// The source keeps its version srcV. A block no replica holds intact
// fails with a *CorruptBlockError, or with zeroLost is zeroed. It
// returns how many blocks it found damaged and mended.
func (u *Upstairs) mendCleanSource(ctx context.Context, rep reconcile.ExtentRepair,
	versions map[reconcile.ReplicaID][]reconcile.Version, epochs [engine.ReplicaCount]uint64,
	srcV wire.ExtentVersion, srcHashes []uint64, blocks []uint32, zeroLost bool) (int, error) {
	e := ids.ExtentID(rep.Extent)
	src := int(rep.Source)
	need, err := u.readIntact(ctx, src, epochs[src], e, blocks, false, nil)
	if err != nil || len(need) == 0 {
		return 0, err
	}
	damaged := len(need)
	asked := []int{src}
	var got blockCopies
	for r := range engine.ReplicaCount {
		if _, present := versions[reconcile.ReplicaID(r)]; r == src || !present || len(need) == 0 {
			continue
		}
		h, err := u.extentHashes(ctx, r, epochs[r], e)
		if err != nil {
			return 0, err
		}
		asked = append(asked, r)
		same, other := reconcile.RecordedAlike(need, srcHashes, h.Hashes)
		bad, err := u.readIntact(ctx, r, epochs[r], e, same, true, &got)
		if err != nil {
			return 0, err
		}
		need = append(other, bad...)
		slices.Sort(need)
	}
	if len(need) > 0 {
		// No peer recorded the source's data for these blocks, so no
		// two replicas acknowledged it (a write that failed, or was cut
		// short by a fence): an intact older copy is as good an outcome
		// for it as any.
		u.log.Warn("activation repair: the only copy of blocks is damaged; taking an older intact copy",
			"extent", e, "replica", src, "blocks", len(need))
		for _, r := range reconcile.NewestFirst(presentVersions(versions), rep.Extent, rep.Source) {
			if len(need) == 0 {
				break
			}
			if need, err = u.readIntact(ctx, int(r), epochs[r], e, need, true, &got); err != nil {
				return 0, err
			}
		}
	}
	if len(need) > 0 && zeroLost {
		u.addZeroedBlocks(&got, e, need, asked)
		need = nil
	}
	if len(need) > 0 {
		return 0, &CorruptBlockError{Extent: e, Block: need[0], Replicas: asked}
	}
	req := &wire.RepairWrite{Extent: e, Version: srcV, Blocks: got.blocks, Hashes: got.hashes, Data: got.data}
	return damaged, u.stamp(ctx, src, epochs[src], req)
}

// presentVersions lists versions by replica, in ReplicaID order.
func presentVersions(versions map[reconcile.ReplicaID][]reconcile.Version) []reconcile.ReplicaVersions {
	var out []reconcile.ReplicaVersions
	for r := range reconcile.ReplicaID(engine.ReplicaCount) {
		if vs, ok := versions[r]; ok {
			out = append(out, reconcile.ReplicaVersions{Replica: r, Extents: vs})
		}
	}
	return out
}
