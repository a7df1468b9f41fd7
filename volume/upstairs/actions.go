package upstairs

import (
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// stepLocked carries out the engine's actions. Cheap ones (bookkeeping,
// wakeups, completions on buffered channels) and rare ones (read repair)
// happen here under mu; privatizing copies are collected for finishLocked,
// which copies with mu released.
func (u *Upstairs) stepLocked() {
	for {
		acts := u.eng.TakeActions()
		if len(acts) == 0 {
			break
		}
		for _, a := range acts {
			u.applyLocked(a)
		}
	}
	if u.spaceWaiters > 0 && !u.eng.Full(0) {
		close(u.spaceCh)
		u.spaceCh = make(chan struct{})
		u.spaceWaiters = 0
	}
	if u.drainWaiters > 0 && u.eng.Drained() {
		close(u.drainCh)
		u.drainCh = make(chan struct{})
		u.drainWaiters = 0
	}
	if u.stepCh != nil {
		close(u.stepCh)
		u.stepCh = nil
	}
}

func (u *Upstairs) applyLocked(a engine.Action) {
	switch a.Kind {
	case engine.ActWake:
		u.replicas[a.Replica].wakeUp()
	case engine.ActComplete:
		rec := u.recs[a.ID]
		if rec == nil || rec.waiter == nil {
			return
		}
		w := rec.waiter
		rec.waiter = nil
		if a.Err != nil && w.err == nil {
			w.err = a.Err
		}
		w.pending--
		if w.pending == 0 {
			w.ch <- struct{}{}
		}
	case engine.ActRetire:
		if rec := u.recs[a.ID]; rec != nil {
			delete(u.recs, a.ID)
			u.pools.putRecord(rec)
		}
	case engine.ActPrivatize:
		u.privatize = append(u.privatize, a.ID)
	case engine.ActRepairRead:
		u.repairLocked(a)
	case engine.ActRewrite:
		parent, child := u.recs[a.Parent], u.pools.record()
		if parent != nil && parent.priv != nil {
			parent.priv.refs++
			child.priv, child.data, child.hashes = parent.priv, parent.priv.data, parent.priv.hashes
			child.start = parent.start
		}
		u.recs[a.ID] = child
	case engine.ActState:
		u.log.Info("replica state", "replica", a.Replica, "target", u.targets[a.Replica], "state", a.State)
		u.replicas[a.Replica].stateChanged(a.State, a.Event)
		close(u.stateCh)
		u.stateCh = make(chan struct{})
	}
}

// finishLocked runs the privatizing copies with mu released, re-locking to
// report their results, until none are left; it returns with mu unlocked.
func (u *Upstairs) finishLocked() {
	for n := len(u.privatize); n > 0; n = len(u.privatize) {
		id := u.privatize[n-1]
		u.privatize = u.privatize[:n-1]
		u.privatizeLocked(id)
	}
	u.mu.Unlock()
}

// privatizeLocked copies write id's data out of the caller's buffer (with
// mu released: the caller is still blocked, so the buffer is stable unless
// the caller races with itself) and reports whether the hashes still hold.
func (u *Upstairs) privatizeLocked(id wire.JobID) {
	rec := u.recs[id]
	if rec == nil {
		u.eng.Privatized(id, true)
		u.stepLocked()
		return
	}
	blocks := len(rec.hashes)
	b := u.pools.buf(len(rec.data), blocks)
	src, bs := rec.data, 0
	if blocks > 0 {
		bs = len(src) / blocks
	}
	u.mu.Unlock()
	if h := u.ioHooks; h != nil && h.privatizing != nil {
		h.privatizing(id)
	}
	copy(b.data, src)
	hashBlocks(b.hashes, b.data, bs)
	u.mu.Lock()
	same := true
	for i, h := range b.hashes {
		if rec.hashes[i] != h {
			same = false
			break
		}
	}
	rec.priv, rec.data, rec.hashes = b, b.data, b.hashes
	u.eng.Privatized(id, same)
	u.stepLocked()
}

// repairLocked rewrites the blocks of read a.id on replica a.replica, which
// returned data that failed verification, from the good data now in the
// caller's buffer. It runs while the engine's actions are applied, before
// the read's completion releases the caller, and must not step the engine
// itself: the actions it causes are applied by the loop in stepLocked.
func (u *Upstairs) repairLocked(a engine.Action) {
	// The engine may have retired the read already; its record lives until
	// the actRetire that follows.
	rec := u.recs[a.ID]
	if rec == nil || u.blockSize == 0 {
		return
	}
	blocks := len(rec.data) / u.blockSize
	b := u.pools.buf(len(rec.data), blocks)
	copy(b.data, rec.data)
	hashBlocks(b.hashes, b.data, u.blockSize)
	id, ok := u.eng.SubmitRepair(a.Replica, a.ID, rec.start, uint32(blocks), len(b.data))
	if !ok {
		u.pools.unref(b)
		u.log.Info("not rewriting blocks that failed verification: newer write or replica gone",
			"replica", a.Replica, "first_block", rec.start, "blocks", blocks)
		return
	}
	r := u.pools.record()
	r.priv, r.data, r.hashes, r.start = b, b.data, b.hashes, rec.start
	u.recs[id] = r
	u.stats.blocksRewritten.Add(uint64(blocks))
	u.log.Warn("rewriting blocks that failed verification from a peer's copy",
		"replica", a.Replica, "first_block", rec.start, "blocks", blocks)
}
