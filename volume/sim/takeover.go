package sim

import (
	"fmt"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// A takeover is a second upstairs activating the region at a higher
// generation, as a migration target does: every downstairs fences the
// first upstairs' session, and the new one reconciles the replicas with
// the real activation planner (reconcile.PlanActivation) before guest IO
// starts, as activation_reconcile.go does: stamp a dirty source with the
// plan's Target, take any block it refuses as corrupt from a donor,
// compare each destination's hashes with the source's, copy the blocks
// that differ and stamp the destination.

// takeover starts upstairs 1 at the next generation.
func (w *world) takeover() {
	old := w.up[w.cur]
	u := newUpNode(w, 1, old.gen+1)
	w.up[1] = u
	u.onActivated = u.reconcileActivation
	w.s.note("takeover by u1 at gen %d", u.gen)
	u.start()
}

// reconcileActivation runs once every replica accepted u's generation.
func (u *upNode) reconcileActivation() {
	n := int(u.w.spec.ExtentCount)
	versions := make([]reconcile.ReplicaVersions, engine.ReplicaCount)
	left := engine.ReplicaCount * n
	failed := false
	for r := range versions {
		versions[r] = reconcile.ReplicaVersions{Replica: reconcile.ReplicaID(r), Extents: make([]reconcile.Version, n)}
		for e := range n {
			u.callOn(r, &message{kind: mExtentHashes, extent: uint32(e)}, func(m *message) {
				left--
				if m == nil || m.kind != mHashesReply {
					failed = true
				} else {
					versions[r].Extents[e] = versionOf(m)
				}
				if left > 0 {
					return
				}
				if failed {
					u.activationFailed("collecting extent versions failed")
					return
				}
				plan, err := reconcile.PlanActivation(u.gen, versions)
				if err != nil {
					u.activationFailed(err.Error())
					return
				}
				u.w.s.note("u%d plans %d extent repairs", u.n, len(plan.Extents))
				u.planVersions = versions
				for _, x := range plan.Extents {
					u.w.s.note("u%d plan: extent %d source d%d (%v) dests %v target %v; versions %v %v %v", u.n, x.Extent, x.Source, x.SourceVersion, x.Dests, x.Target,
						versions[0].Extents[x.Extent], versions[1].Extents[x.Extent], versions[2].Extents[x.Extent])
				}
				u.repairPlan(plan, 0)
			})
		}
	}
}

func versionOf(m *message) reconcile.Version {
	return reconcile.Version{Gen: m.version.Gen, Flush: m.version.Flush, Dirty: m.version.Dirty}
}

// activationFailed gives the activation up; the next try uses a higher
// generation (the control plane retries a migration).
func (u *upNode) activationFailed(why string) {
	if u.restarting {
		u.restartFailed(why)
		return
	}
	u.w.s.note("u%d activation failed: %s", u.n, why)
	u.w.violate("takeover activation at gen %d failed: %s", u.gen, why)
}

// repairPlan repairs plan.Extents[i:], then starts IO.
func (u *upNode) repairPlan(plan reconcile.Plan, i int) {
	u.repairPlanThen(plan, i, func() {
		u.eng.Activate([engine.ReplicaCount]bool{true, true, true}, plan.NextFlush())
		u.w.cur = u.n
		u.w.oracle.takeover(u.n)
		u.w.s.note("u%d activated at gen %d", u.n, u.gen)
		u.apply()
	})
}

// repairPlanThen repairs plan.Extents[i:], then calls done.
func (u *upNode) repairPlanThen(plan reconcile.Plan, i int, done func()) {
	if i == len(plan.Extents) {
		done()
		return
	}
	x := plan.Extents[i]
	next := func() { u.repairPlanThen(plan, i+1, done) }
	e := uint32(x.Extent)
	src := int(x.Source)
	target := toExtentVersion(x.Target)
	copyDests := func() { u.copyToDests(x, src, 0, next) }
	if !x.SourceNeedsStamp() {
		copyDests()
		return
	}
	u.callOn(src, &message{kind: mRepairWrite, extent: e, version: target}, func(m *message) {
		if m == nil || m.kind != mAck {
			u.activationFailed("stamping the source failed: " + replyText(m))
			return
		}
		u.callOn(src, &message{kind: mExtentHashes, extent: e}, func(h *message) {
			if h == nil || h.kind != mHashesReply {
				u.activationFailed("reading the source failed")
				return
			}
			if !h.version.Dirty {
				copyDests()
				return
			}
			// Still dirty: it holds corrupt blocks. Mend them from the
			// donors (repair_corrupt.go).
			u.mendSource(x, h.hashes, 0, copyDests)
		})
	})
}

// mendSource replaces each block of x's source that it refuses as corrupt
// with a donor's intact copy, probing the blocks that differ from the
// first donor one by one (blocks [b, end)).
func (u *upNode) mendSource(x reconcile.ExtentRepair, srcHashes []uint64, b int, done func()) {
	e := uint32(x.Extent)
	src := int(x.Source)
	if b == len(srcHashes) {
		u.callOn(src, &message{kind: mRepairWrite, extent: e, version: toExtentVersion(x.Target)}, func(m *message) {
			if m == nil || m.kind != mAck {
				u.activationFailed("stamping the mended source failed")
				return
			}
			done()
		})
		return
	}
	next := func() { u.mendSource(x, srcHashes, b+1, done) }
	u.callOn(src, &message{kind: mRepairRead, extent: e, blocks: []uint32{uint32(b)}}, func(m *message) {
		if m != nil && m.kind == mRepairData {
			next()
			return
		}
		if m == nil || m.code != 4 /* CodeCorruptBlock */ {
			u.activationFailed("reading the source failed: " + replyText(m))
			return
		}
		u.takeFromDonor(x, b, 0, next)
	})
}

// takeFromDonor copies block b of x's extent from the first of
// x.Donors[d:] that holds it intact to the source.
func (u *upNode) takeFromDonor(x reconcile.ExtentRepair, b, d int, done func()) {
	e := uint32(x.Extent)
	if d == len(x.Donors) && u.restarting {
		// restart reconciliation: takeFromDonors zeroes a block every
		// replica tore at once.
		u.w.s.note("u%d: extent %d block %d torn on every replica: zeroed", u.n, e, b)
		u.w.lostEverywhere(uint64(e)*uint64(u.w.spec.ExtentBlocks) + uint64(b))
		zero := make([]byte, u.w.spec.BlockSize)
		dirty := toExtentVersion(x.SourceVersion)
		dirty.Dirty = true
		w := &message{kind: mRepairWrite, extent: e, blocks: []uint32{uint32(b)}, data: zero, hashes: u.w.hashBlocks(zero), version: dirty}
		u.callOn(int(x.Source), w, func(a *message) {
			if a == nil || a.kind != mAck {
				u.activationFailed("zeroing a lost block failed: " + replyText(a))
				return
			}
			done()
		})
		return
	}
	if d == len(x.Donors) {
		u.activationFailed(fmt.Sprintf("extent %d block %d is corrupt on every replica", e, b))
		return
	}
	donor := int(x.Donors[d])
	u.callOn(donor, &message{kind: mRepairRead, extent: e, blocks: []uint32{uint32(b)}}, func(m *message) {
		if m == nil || m.kind != mRepairData || u.w.hashBlocks(m.data)[0] != m.hashes[0] {
			// readIntact: refused as corrupt, or its data fails the
			// hash recorded with it (a bit flipped at rest).
			u.takeFromDonor(x, b, d+1, done)
			return
		}
		dirty := toExtentVersion(x.SourceVersion)
		dirty.Dirty = true
		w := &message{kind: mRepairWrite, extent: e, blocks: m.blocks, data: m.data, hashes: m.hashes, version: dirty}
		u.callOn(int(x.Source), w, func(a *message) {
			if a == nil || a.kind != mAck {
				u.activationFailed("mending the source failed: " + replyText(a))
				return
			}
			done()
		})
	})
}

// copyToDests copies x's differing blocks from src to x.Dests[d:] and
// stamps them. If the destination refuses src's data as not matching its
// hashes, a replica at src's clean version takes its place
// (activation_reconcile.go's equalSource).
func (u *upNode) copyToDests(x reconcile.ExtentRepair, src, d int, done func()) {
	u.copyToDest(x, src, d, 0, false, done)
}

// copyToDest copies to x.Dests[d]; mends and lastMended count the mends
// of the source for this destination (reconcile.MendSourceAgain).
func (u *upNode) copyToDest(x reconcile.ExtentRepair, src, d, mends int, lastMended bool, done func()) {
	if d == len(x.Dests) {
		done()
		return
	}
	e := uint32(x.Extent)
	dst := int(x.Dests[d])
	target := toExtentVersion(x.Target)
	next := func() { u.copyToDest(x, src, d+1, 0, false, done) }
	var sh, dh *message
	got := 0
	compared := func() {
		if got++; got < 2 {
			return
		}
		if sh == nil || dh == nil || sh.kind != mHashesReply || dh.kind != mHashesReply {
			u.activationFailed("comparing hashes failed")
			return
		}
		diff, err := reconcile.DiffBlocks(sh.hashes, dh.hashes)
		if err != nil {
			u.activationFailed(err.Error())
			return
		}
		blocks := make([]uint32, len(diff))
		for i, b := range diff {
			blocks[i] = uint32(b)
		}
		stamp := func(m *message) {
			if m != nil && m.kind == mError && m.code == wire.CodeHashMismatch &&
				reconcile.MendSourceAgain(!sh.version.Dirty, mends, lastMended) {
				// activation_reconcile.go's mendCleanSource.
				u.w.s.note("u%d: d%d served bad data for extent %d; mending it (mend %d)", u.n, src, e, mends+1)
				u.mendClean(x, src, sh, blocks, func(n int) { u.copyToDest(x, src, d, mends+1, n > 0, done) })
				return
			}
			if m == nil || m.kind != mAck {
				u.activationFailed("repair write failed: " + replyText(m))
				return
			}
			next()
		}
		if len(blocks) == 0 {
			u.callOn(dst, &message{kind: mRepairWrite, extent: e, version: target}, stamp)
			return
		}
		u.callOn(src, &message{kind: mRepairRead, extent: e, blocks: blocks}, func(m *message) {
			if m == nil || m.kind != mRepairData {
				u.activationFailed("repair read failed: " + replyText(m))
				return
			}
			u.callOn(dst, &message{kind: mRepairWrite, extent: e, blocks: blocks, data: m.data, hashes: m.hashes, version: target}, stamp)
		})
	}
	u.callOn(src, &message{kind: mExtentHashes, extent: e}, func(m *message) { sh = m; compared() })
	u.callOn(dst, &message{kind: mExtentHashes, extent: e}, func(m *message) { dh = m; compared() })
}

func toExtentVersion(v reconcile.Version) extent.Version {
	return extent.Version{Gen: ids.Generation(v.Gen), Flush: v.Flush, Dirty: v.Dirty}
}

// mendClean rewrites the blocks of src's clean copy of x's extent whose
// data fails the hash src recorded, with the intact copy of a replica
// that recorded the same hash (activation_reconcile.go's mendCleanSource).
// done gets how many damaged blocks it found.
func (u *upNode) mendClean(x reconcile.ExtentRepair, src int, sh *message, blocks []uint32, done func(mended int)) {
	e := uint32(x.Extent)
	var bad []uint32
	left := len(blocks)
	for _, b := range blocks {
		u.callOn(src, &message{kind: mRepairRead, extent: e, blocks: []uint32{b}}, func(m *message) {
			if m == nil || m.kind != mRepairData || u.w.hashBlocks(m.data)[0] != m.hashes[0] {
				bad = append(bad, b)
			}
			if left--; left > 0 {
				return
			}
			if len(bad) == 0 {
				done(0)
				return
			}
			n := len(bad)
			u.mendFrom(x, src, sh, bad, 0, false, &message{kind: mRepairWrite, extent: e, version: sh.version}, func() { done(n) })
		})
	}
}

// mendFrom takes the blocks in need from replica r and the ones after
// it, then writes them to src.
func (u *upNode) mendFrom(x reconcile.ExtentRepair, src int, sh *message, need []uint32, r int, anyCopy bool, w *message, done func()) {
	e := uint32(x.Extent)
	order := u.peerOrder(x, src, anyCopy)
	if len(need) > 0 && r >= len(order) && !anyCopy {
		// mendCleanSource's second pass: any intact copy.
		u.w.s.note("u%d: only copy of extent %d blocks %v damaged on d%d; taking older intact copies", u.n, e, need, src)
		u.mendFrom(x, src, sh, need, 0, true, w, done)
		return
	}
	if len(need) > 0 && r >= len(order) && u.restarting {
		// restart reconciliation: addZeroedBlocks.
		u.w.s.note("u%d: extent %d blocks %v damaged on every replica: zeroed", u.n, e, need)
		zero := make([]byte, u.w.spec.BlockSize)
		for _, b := range need {
			u.w.lostEverywhere(uint64(e)*uint64(u.w.spec.ExtentBlocks) + uint64(b))
			w.blocks = append(w.blocks, b)
			w.hashes = append(w.hashes, u.w.hashBlocks(zero)[0])
			w.data = append(w.data, zero...)
		}
		need = nil
	}
	if len(need) == 0 || r >= len(order) {
		if len(need) > 0 {
			u.activationFailed(fmt.Sprintf("extent %d block %d: no intact copy", e, need[0]))
			return
		}
		u.callOn(src, w, func(m *message) {
			if m == nil || m.kind != mAck {
				u.activationFailed("mending the source failed: " + replyText(m))
				return
			}
			done()
		})
		return
	}
	peer := order[r]
	u.callOn(peer, &message{kind: mExtentHashes, extent: e}, func(h *message) {
		if h == nil || h.kind != mHashesReply {
			u.activationFailed("reading a peer's hashes failed")
			return
		}
		same, other := need, []uint32(nil)
		if !anyCopy {
			same, other = reconcile.RecordedAlike(need, sh.hashes, h.hashes)
		}
		if len(same) == 0 {
			u.mendFrom(x, src, sh, other, r+1, anyCopy, w, done)
			return
		}
		u.callOn(peer, &message{kind: mRepairRead, extent: e, blocks: same}, func(m *message) {
			bs := int(u.w.spec.BlockSize)
			if m != nil && m.kind == mRepairData {
				hs := u.w.hashBlocks(m.data)
				for i, b := range same {
					if hs[i] == m.hashes[i] {
						w.blocks = append(w.blocks, b)
						w.hashes = append(w.hashes, m.hashes[i])
						w.data = append(w.data, m.data[i*bs:(i+1)*bs]...)
					} else {
						other = append(other, b)
					}
				}
			} else {
				other = append(other, same...)
			}
			u.mendFrom(x, src, sh, other, r+1, anyCopy, w, done)
		})
	})
}

// peerOrder lists the replicas other than src that mendFrom asks: in ID
// order for a copy recorded alike, and for any intact copy the
// production order (reconcile.NewestFirst).
func (u *upNode) peerOrder(x reconcile.ExtentRepair, src int, newest bool) []int {
	var out []int
	if newest {
		for _, r := range reconcile.NewestFirst(u.planVersions, x.Extent, reconcile.ReplicaID(src)) {
			out = append(out, int(r))
		}
		return out
	}
	for r := range engine.ReplicaCount {
		if r != src {
			out = append(out, r)
		}
	}
	return out
}
