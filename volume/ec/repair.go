package ec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"

	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// repairBatch is how many stripes a repair step locks and reads at once.
const repairBatch = 256 // 1 MiB a shard at 4 KiB blocks: one frame

// repairLoop is session s's repair goroutine: whenever shard sh has
// stripes marked behind (it missed writes, failed a hash, came back from
// a crash or joined late), it rebuilds them by reconstruction from the
// other shards, writing only blocks that differ from what it holds,
// while IO continues. It ends with the session.
func (v *Volume) repairLoop(sh *shard, s *session) {
	defer v.wg.Done()
	sh.wake()
	for {
		select {
		case <-s.done:
			return
		case <-v.ctx.Done():
			return
		case <-sh.kick:
		}
		v.mu.Lock()
		ready := v.running && sh.sess == s && sh.missed.count > 0
		v.mu.Unlock()
		if !ready {
			continue
		}
		if err := v.repairShard(sh, s); err != nil && v.ctx.Err() == nil {
			v.log.Warn("shard repair stopped; retrying when shards change", "shard", sh.id, "err", err)
			v.mu.Lock()
			ch := v.stateCh
			v.mu.Unlock()
			select {
			case <-ch:
			case <-s.done:
				return
			case <-v.ctx.Done():
				return
			case <-time.After(v.cfg.ReconnectMax):
			}
			sh.wake()
		}
	}
}

// repairShard walks sh's marked stripes once, extent by extent.
func (v *Volume) repairShard(sh *shard, s *session) error {
	tr := reconcile.NewTracker(nil)
	v.mu.Lock()
	sh.repair = tr
	eb := StripeIndex(v.region.ExtentBlocks)
	var extents []StripeIndex
	for st, ok := sh.missed.next(0); ok; st, ok = sh.missed.next((st/eb + 1) * eb) {
		extents = append(extents, st/eb)
	}
	v.notifyLocked()
	v.mu.Unlock()
	_ = tr.SetPhase(reconcile.PhaseLiveRepair)
	tr.GrowTotals(uint64(len(extents)), 0)
	v.log.Info("repairing shard", "shard", sh.id, "extents", len(extents))
	for _, e := range extents {
		if err := v.repairExtent(sh, s, e, tr); err != nil {
			tr.Fail(err)
			return err
		}
		tr.ExtentDone()
	}
	tr.Finish()
	v.mu.Lock()
	v.notifyLocked()
	v.mu.Unlock()
	// Make the rebuilt blocks durable and the shard's metadata current.
	fctx, cancel := context.WithTimeout(v.ctx, v.cfg.ReplyTimeout)
	defer cancel()
	return v.Flush(fctx)
}

// repairExtent rebuilds sh's marked stripes of extent e: its recorded
// hashes are compared with those of the reconstructed blocks, and only
// blocks that differ are written.
func (v *Volume) repairExtent(sh *shard, s *session, e StripeIndex, tr *reconcile.Tracker) error {
	ctx := v.ctx
	eb := StripeIndex(v.region.ExtentBlocks)
	rctx, cancel := context.WithTimeout(ctx, v.cfg.ReplyTimeout)
	m, err := s.call(rctx, &wire.ExtentHashesRequest{Extent: ids.ExtentID(e)}, nil)
	cancel()
	if err != nil {
		return fmt.Errorf("reading shard %d's hashes of extent %d: %w", sh.id, e, err)
	}
	eh, _ := m.(*wire.ExtentHashes)
	if eh == nil || len(eh.Hashes) != int(eb) {
		return fmt.Errorf("shard %d answered extent hashes with %v", sh.id, m.Type())
	}
	zero := xxhash.Sum64(make([]byte, v.bs))
	end := min((e+1)*eb, StripeIndex(v.stripes))
	for base := e * eb; base < end; base += repairBatch {
		last := min(base+repairBatch, end) - 1
		v.mu.Lock()
		st, any := sh.missed.next(base)
		v.mu.Unlock()
		if !any || st > last {
			continue
		}
		recorded := func(st StripeIndex) uint64 {
			h := eh.Hashes[st-e*eb]
			if h == 0 {
				return zero
			}
			return h
		}
		if err := v.repairStripes(ctx, sh, s, base, last, recorded, tr); err != nil {
			return err
		}
	}
	return nil
}

// repairStripes rebuilds sh's marked stripes among [first, last] under
// their locks.
func (v *Volume) repairStripes(ctx context.Context, sh *shard, s *session, first, last StripeIndex,
	recorded func(StripeIndex) uint64, tr *reconcile.Tracker) error {
	unlock, err := v.locks.lock(ctx, first, last, true)
	if err != nil {
		return err
	}
	defer unlock()
	n := v.cfg.Layout.Shards()
	want := make([]bool, n)
	for i := range want {
		want[i] = true
	}
	// Its own blocks too: a block whose data rotted under a correct
	// recorded hash differs in its data only.
	rd := v.readStripes(ctx, first, last, want)
	var rw []rewrite
	var checked []StripeIndex
	for st := first; st <= last; st++ {
		v.mu.Lock()
		marked := sh.missed.has(st) && sh.sess == s
		v.mu.Unlock()
		if !marked {
			continue
		}
		stripe := make([][]byte, n)
		for i := range stripe {
			if i != sh.id {
				stripe[i] = rd.block(i, st)
			}
		}
		if err := v.codec.Reconstruct(stripe); err != nil {
			if !errors.Is(err, ErrTooFewShards) {
				return fmt.Errorf("reconstructing stripe %d for shard %d: %w", st, sh.id, err)
			}
			vouched, ok := v.vouchFor(rd, st)
			if !ok {
				return fmt.Errorf("reconstructing stripe %d for shard %d: %w", st, sh.id, err)
			}
			// The stripe is decided; this shard's block is rewritten
			// below if it differs.
			stripe = vouched.Stripe
		}
		tr.AddCompared(1)
		block := stripe[sh.id]
		h := xxhash.Sum64(block)
		var held []byte
		if rd.intact[sh.id] != nil {
			j := int(st - first)
			held = rd.data[sh.id][j*v.bs : (j+1)*v.bs]
		}
		if h != recorded(st) || !bytes.Equal(held, block) {
			tr.GrowTotals(0, uint64(v.bs))
			rw = append(rw, rewrite{st: st, block: block})
		} else {
			checked = append(checked, st)
		}
	}
	if len(rw) > 0 {
		if err := v.sendRewrites(ctx, sh, s, rw); err != nil {
			return err
		}
		tr.AddBytes(uint64(len(rw) * v.bs))
	}
	v.mu.Lock()
	for _, st := range checked {
		sh.missed.remove(st)
	}
	for _, r := range rw {
		sh.missed.remove(r.st)
	}
	v.mu.Unlock()
	return nil
}

// rewrite is one rebuilt block for one shard.
type rewrite struct {
	st    StripeIndex
	block []byte
}

// sendRewrites writes rebuilt blocks (in stripe order) to shard sh, one
// write per contiguous run, all in flight at once. A failure drops the
// shard (its blocks stay marked behind).
func (v *Volume) sendRewrites(ctx context.Context, sh *shard, s *session, rw []rewrite) error {
	v.mu.Lock()
	for _, r := range rw {
		v.noteWrittenLocked(sh, r.st, r.st)
	}
	v.mu.Unlock()
	var pending []*pendingReq
	var err error
	for i := 0; i < len(rw) && err == nil; {
		j := i + 1
		for j < len(rw) && rw[j].st == rw[j-1].st+1 && j-i < wire.MaxDataSize/v.bs {
			j++
		}
		data := make([]byte, 0, (j-i)*v.bs)
		hashes := make([]uint64, 0, j-i)
		for _, r := range rw[i:j] {
			data = append(data, r.block...)
			hashes = append(hashes, xxhash.Sum64(r.block))
		}
		var p *pendingReq
		if p, err = s.start(&wire.Write{Offset: rw[i].st, Hashes: hashes, Data: data}, nil); err == nil {
			pending = append(pending, p)
		}
		i = j
	}
	rctx, cancel := context.WithTimeout(ctx, v.cfg.ReplyTimeout)
	defer cancel()
	for _, p := range pending {
		if _, werr := s.wait(rctx, p); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		v.writeFailed(sh.id, s, err)
		return fmt.Errorf("rewriting %d blocks of shard %d from stripe %d: %w", len(rw), sh.id, rw[0].st, err)
	}
	return nil
}

// ScrubReport is what Scrub found.
type ScrubReport struct {
	// StripesChecked counts stripes read and resolved.
	StripesChecked uint64
	// BlocksRewritten counts shard blocks that were missing, failed their
	// hash or disagreed with their stripe, and were rewritten.
	BlocksRewritten uint64
	// Outliers counts stripes where one block disagreed with the rest.
	Outliers uint64
	// ParityRecomputed counts stripes whose parity was recomputed from
	// their data (the blocks disagreed with no single one to blame).
	ParityRecomputed uint64
}

// Scrub reads every stripe from every connected shard, checks every
// block against its hash and every stripe's parity against its data, and
// rewrites each block that is wrong (Codec.Resolve), stripe range by
// stripe range under their locks while IO continues.
func (v *Volume) Scrub(ctx context.Context) (ScrubReport, error) {
	v.mu.Lock()
	stripes, running := v.stripes, v.running
	v.mu.Unlock()
	if !running {
		return ScrubReport{}, ErrNotActive
	}
	return v.resolveRange(ctx, 0, StripeIndex(stripes-1), nil, nil)
}

// resolveRange resolves every stripe of [first, last] (Codec.Resolve)
// and rewrites each connected shard's block that differs. A shard is a
// suspect on a stripe where it is marked behind, or where suspect (by
// shard, may be nil) says so. tr, if set, counts the work.
func (v *Volume) resolveRange(ctx context.Context, first, last StripeIndex, suspect []bool, tr *reconcile.Tracker) (ScrubReport, error) {
	var rep ScrubReport
	n := v.cfg.Layout.Shards()
	all := make([]bool, n)
	for i := range all {
		all[i] = true
	}
	// Batches lock disjoint stripes, so a few run at once: one's reads
	// overlap another's rewrites.
	var (
		mu      sync.Mutex
		firstEr error
		wg      sync.WaitGroup
		next    = first
	)
	batch := func() (StripeIndex, StripeIndex, bool) {
		mu.Lock()
		defer mu.Unlock()
		if next > last || firstEr != nil {
			return 0, 0, false
		}
		base := next
		next = min(base+repairBatch-1, last) + 1
		return base, next - 1, true
	}
	for range resolveWorkers {
		wg.Go(func() {
			for {
				base, end, ok := batch()
				if !ok {
					return
				}
				r, err := v.resolveBatch(ctx, base, end, all, suspect, tr)
				mu.Lock()
				rep.StripesChecked += r.StripesChecked
				rep.BlocksRewritten += r.BlocksRewritten
				rep.Outliers += r.Outliers
				rep.ParityRecomputed += r.ParityRecomputed
				if err != nil && firstEr == nil {
					firstEr = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return rep, firstEr
}

// resolveWorkers is how many stripe batches resolveRange works on at once.
const resolveWorkers = 4

// resolveBatch resolves stripes [base, end] under their locks.
func (v *Volume) resolveBatch(ctx context.Context, base, end StripeIndex, all, suspect []bool, tr *reconcile.Tracker) (ScrubReport, error) {
	var rep ScrubReport
	n := v.cfg.Layout.Shards()
	{
		err := v.retry(ctx, func() error {
			rep = ScrubReport{} // counts of this attempt only
			unlock, err := v.locks.lock(ctx, base, end, true)
			if err != nil {
				return err
			}
			defer unlock()
			rd := v.readStripes(ctx, base, end, all)
			v.mu.Lock()
			sessions := make([]*session, n)
			for i, sh := range v.shards {
				sessions[i] = sh.sess
			}
			v.mu.Unlock()
			rws := make([][]rewrite, n)
			current := make([][]StripeIndex, n)
			for st := base; st <= end; st++ {
				blocks := make([][]byte, n)
				sus := make([]bool, n)
				v.mu.Lock()
				for i, sh := range v.shards {
					blocks[i] = rd.block(i, st)
					sus[i] = sh.missed.has(st) || suspect != nil && suspect[i]
					if blocks[i] == nil && rd.intact[i] != nil && sus[i] {
						// Behind, not corrupt: compare what it holds.
						j := int(st - base)
						blocks[i] = rd.data[i][j*v.bs : (j+1)*v.bs]
					}
				}
				v.mu.Unlock()
				res, err := v.codec.Resolve(blocks, sus)
				if errors.Is(err, ErrTooFewShards) || suspect != nil && errors.Is(err, ErrInconsistentStripe) {
					// Too many shards are suspect on it: metadata lags
					// whenever a shard owed a write as a flush began, so
					// after a takeover under load several shards may be
					// suspect on a stripe the old upstairs left torn.
					// Decide it from every block that matches its hash,
					// as vouchFor does for IO, and at activation settle
					// it as a torn stripe is settled.
					res, err = v.vouchedStripe(rd, st, suspect != nil)
				}
				if err != nil {
					return fmt.Errorf("resolving stripe %d: %w", st, err)
				}
				rep.StripesChecked++
				switch res.How {
				case Outlier:
					rep.Outliers++
				case ParityRecomputed:
					rep.ParityRecomputed++
				}
				if tr != nil {
					tr.AddCompared(uint64(n))
				}
				for i, differs := range res.Differs {
					switch {
					case sessions[i] == nil:
					case differs:
						rws[i] = append(rws[i], rewrite{st: st, block: res.Stripe[i]})
					default:
						current[i] = append(current[i], st)
					}
				}
			}
			for i, rw := range rws {
				if len(rw) == 0 {
					continue
				}
				if tr != nil {
					tr.GrowTotals(0, uint64(len(rw)*v.bs))
				}
				if err := v.sendRewrites(ctx, v.shards[i], sessions[i], rw); err != nil {
					// Dropped; its repair rebuilds the blocks.
					v.mu.Lock()
					for _, r := range rw {
						v.shards[i].missed.add(r.st)
					}
					v.mu.Unlock()
					continue
				}
				rep.BlocksRewritten += uint64(len(rw))
				if tr != nil {
					tr.AddBytes(uint64(len(rw) * v.bs))
				}
				for _, r := range rw {
					current[i] = append(current[i], r.st)
				}
			}
			v.mu.Lock()
			for i, sts := range current {
				for _, st := range sts {
					v.shards[i].missed.remove(st)
				}
			}
			v.mu.Unlock()
			return nil
		})
		if err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// vouchFor handles a stripe with fewer than Data trusted blocks (too
// many shards are behind on it, say after several crashed with unflushed
// writes): it decides the stripe from the blocks that match their hashes
// (vouchedStripe, settling a torn one), and every shard whose block is
// the decided one is current on it again. false, and the stripe stays
// behind (IO on it waits), while too few blocks came back to decide it.
func (v *Volume) vouchFor(rd *stripeRead, st StripeIndex) (Resolution, bool) {
	res, err := v.vouchedStripe(rd, st, true)
	if err != nil {
		return Resolution{}, false
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	for i, differs := range res.Differs {
		if !differs {
			v.shards[i].missed.remove(st)
		}
	}
	v.notifyLocked()
	return res, true
}

// everyShardRead reports whether every shard answered the read.
func everyShardRead(rd *stripeRead) bool {
	for _, r := range rd.recorded {
		if r == nil {
			return false
		}
	}
	return true
}

// vouchedStripe decides a stripe whose trusted blocks are fewer than
// Data, or disagree, from every block read of it that matches its
// recorded hash, behind or not: more than Data of them agreeing as one
// stripe are its content (a stale block would disagree with the parity).
// With settle, blocks that disagree are settled by Codec.Resolve's rules
// and, when those cannot decide (a data block missing too) and every
// shard answered, by Codec.Settle; then exactly Data blocks are enough.
// ErrTooFewShards otherwise.
func (v *Volume) vouchedStripe(rd *stripeRead, st StripeIndex, settle bool) (Resolution, error) {
	n := v.cfg.Layout.Shards()
	blocks := make([][]byte, n)
	have := 0
	for i := range n {
		if blocks[i] = rd.raw(i, st); blocks[i] != nil {
			have++
		}
	}
	if have < v.cfg.Layout.Data || have == v.cfg.Layout.Data && (!settle || !everyShardRead(rd)) {
		return Resolution{}, ErrTooFewShards
	}
	var res Resolution
	err := ErrInconsistentStripe
	if have > v.cfg.Layout.Data {
		res, err = v.codec.Resolve(blocks, make([]bool, n))
	}
	if settle && errors.Is(err, ErrInconsistentStripe) && everyShardRead(rd) {
		// Only with every shard's blocks and recorded hashes in hand:
		// one still away may hold the block that decides it.
		recorded, known := make([]uint64, n), make([]bool, n)
		for i := range n {
			recorded[i], known[i] = rd.recordedHash(i, st)
		}
		if s, serr := v.codec.Settle(blocks, recorded, known); serr == nil {
			res, err = s, nil
		}
	}
	switch {
	case err != nil:
		return Resolution{}, fmt.Errorf("%w: %w", ErrTooFewShards, err)
	case res.How != Consistent && !settle:
		return Resolution{}, ErrTooFewShards
	case res.How != Consistent:
		v.log.Warn("stripe settled from the blocks that match their hashes", "stripe", st, "decision", res.How)
	}
	return res, nil
}
