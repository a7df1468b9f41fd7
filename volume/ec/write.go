package ec

import (
	"context"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"

	"tern/volume/wire"
)

// shardWrite is the part of a stripe range one shard gets: stripes
// [first+lo, first+hi] of its blocks.
type shardWrite struct {
	lo, hi int // stripe offsets within the chunk, inclusive; lo > hi: none
	data   []byte
	hashes []uint64
}

// writeChunk writes client blocks [first, first+count) from p; the caller
// holds their stripes exclusively.
func (v *Volume) writeChunk(ctx context.Context, p []byte, first, count uint64) error {
	l, bs := v.cfg.Layout, v.bs
	k := uint64(l.Data)
	s0, s1 := first/k, (first+count-1)/k
	nst := int(s1 - s0 + 1)
	// The chunk's stripes in client order, the rest of a partial stripe
	// read back first.
	data := make([]byte, nst*int(k)*bs)
	head := first - s0*k
	tail := (s1+1)*k - (first + count)
	copy(data[head*uint64(bs):], p)
	if head > 0 {
		if err := v.readBlocks(ctx, data[:head*uint64(bs)], s0*k, head); err != nil {
			return err
		}
	}
	if tail > 0 {
		if err := v.readBlocks(ctx, data[len(data)-int(tail)*bs:], first+count, tail); err != nil {
			return err
		}
	}
	writes := make([]shardWrite, l.Shards())
	for i := range writes {
		w := &writes[i]
		w.lo, w.hi = 0, nst-1
		if i < l.Data {
			// Data shard i is written where the client range covers its block.
			for w.lo < nst && (s0+uint64(w.lo))*k+uint64(i) < first {
				w.lo++
			}
			for w.hi >= 0 && (s0+uint64(w.hi))*k+uint64(i) >= first+count {
				w.hi--
			}
		}
		w.data = make([]byte, nst*bs)
	}
	stripe := make([][]byte, l.Shards())
	for j := range nst {
		for i := range stripe {
			stripe[i] = writes[i].data[j*bs : (j+1)*bs]
		}
		for d := range l.Data {
			off := (j*l.Data + d) * bs
			copy(stripe[d], data[off:off+bs])
		}
		if err := v.codec.Encode(stripe); err != nil {
			return err
		}
	}
	for i := range writes {
		w := &writes[i]
		if w.lo > w.hi {
			continue
		}
		w.data = w.data[w.lo*bs : (w.hi+1)*bs]
		w.hashes = make([]uint64, w.hi-w.lo+1)
		for j := range w.hashes {
			w.hashes[j] = xxhash.Sum64(w.data[j*bs : (j+1)*bs])
		}
	}
	return v.sendWrites(ctx, StripeIndex(s0), nst, writes)
}

// writeResult is one shard's answer to its part of a write.
type writeResult struct {
	shard int
	err   error
}

// sendWrites sends each shard its part and returns once every stripe is
// held by enough shards (see WriteAt), errRetry when it cannot be.
func (v *Volume) sendWrites(ctx context.Context, s0 StripeIndex, nst int, writes []shardWrite) error {
	l := v.cfg.Layout
	n := l.Shards()
	sessions := make([]*session, n)
	// holders[j] counts shards already current on stripe s0+j that this
	// write does not touch; acked shards are added as they answer.
	holders := make([]int, nst)
	v.mu.Lock()
	for i, sh := range v.shards {
		if sh.sess == nil {
			continue
		}
		for j := range nst {
			w := writes[i]
			if (j < w.lo || j > w.hi) && !sh.missed.has(s0+StripeIndex(j)) {
				holders[j]++
			}
		}
	}
	// Enough shards could hold every stripe?
	for j := range nst {
		could := holders[j]
		for i, sh := range v.shards {
			if w := writes[i]; sh.sess != nil && j >= w.lo && j <= w.hi {
				could++
			}
		}
		if could < l.Data {
			v.mu.Unlock()
			return fmt.Errorf("%w: stripe %d: %d shards can hold it, %d needed", errRetry, s0+StripeIndex(j), could, l.Data)
		}
	}
	// Until a shard acknowledges its part, its blocks there are not
	// trusted (no read uses them, no other write counts them).
	for i, sh := range v.shards {
		w := writes[i]
		if w.lo > w.hi {
			continue
		}
		for j := w.lo; j <= w.hi; j++ {
			sh.missed.add(s0 + StripeIndex(j))
		}
		v.noteWrittenLocked(sh, s0+StripeIndex(w.lo), s0+StripeIndex(w.hi))
		sessions[i] = sh.sess
	}
	v.mu.Unlock()

	// Send in shard order from this goroutine, so that a flush started
	// after this write returns is behind it on every shard.
	results := make(chan writeResult, n)
	pending := 0
	for i, s := range sessions {
		if s == nil {
			continue
		}
		w := writes[i]
		p, err := s.start(&wire.Write{Offset: s0 + StripeIndex(w.lo), Hashes: w.hashes, Data: w.data}, nil)
		if err != nil {
			v.writeFailed(i, s, err)
			continue
		}
		pending++
		ok := v.goIO(func() {
			rctx, cancel := context.WithTimeout(v.ctx, v.cfg.ReplyTimeout)
			defer cancel()
			_, err := s.wait(rctx, p)
			if err == nil {
				v.mu.Lock()
				for j := w.lo; j <= w.hi; j++ {
					v.shards[i].missed.remove(s0 + StripeIndex(j))
				}
				v.mu.Unlock()
			} else {
				v.writeFailed(i, s, err)
			}
			results <- writeResult{shard: i, err: err}
		})
		if !ok {
			results <- writeResult{shard: i, err: ErrClosed}
		}
	}
	acked := make([]int, nst)
	copy(acked, holders)
	for pending > 0 {
		var r writeResult
		select {
		case r = <-results:
		case <-ctx.Done():
			return ctx.Err()
		}
		pending--
		if r.err != nil {
			if errors.Is(r.err, ErrFenced) {
				return r.err
			}
			continue
		}
		w := writes[r.shard]
		for j := w.lo; j <= w.hi; j++ {
			acked[j]++
		}
		if v.enough(acked) {
			return nil
		}
	}
	if v.enough(acked) {
		return nil
	}
	return fmt.Errorf("%w: write at stripe %d", errRetry, s0)
}

// enough reports whether every stripe's holder count meets the
// acknowledgement rule: Data+1, or every connected shard when fewer are
// connected, and never fewer than Data.
func (v *Volume) enough(holders []int) bool {
	v.mu.Lock()
	connected := 0
	for _, sh := range v.shards {
		if sh.sess != nil {
			connected++
		}
	}
	v.mu.Unlock()
	k := v.cfg.Layout.Data
	need := max(k, min(k+1, connected))
	for _, h := range holders {
		if h < need {
			return false
		}
	}
	return true
}

// writeFailed drops a shard that failed a write (its blocks stay marked
// behind, for its repair when it is back), or stops the volume when the
// shard says another generation took over.
func (v *Volume) writeFailed(i int, s *session, err error) {
	if errors.Is(err, ErrFenced) {
		v.fence(fmt.Errorf("shard %d: %w", i, err))
		return
	}
	if v.ctx.Err() == nil {
		v.dropShard(v.shards[i], s, fmt.Errorf("write failed: %w", err))
	}
}

// Flush makes every write acknowledged before it durable on Data+1
// shards (every connected one when fewer are, never fewer than Data).
// Below Data connected shards it waits until enough are back or ctx ends.
func (v *Volume) Flush(ctx context.Context) error {
	return v.retry(ctx, func() error { return v.flushOnce(ctx, false) })
}

// deactivate flushes and waits for every connected shard's answer (not
// only enough of them), so that a clean close leaves every shard's data
// and metadata current.
func (v *Volume) deactivate(ctx context.Context) error {
	// Twice: a shard still owing a write when the first flush started
	// has answered it by the end of that flush, and the second records
	// it current in its metadata.
	for range 2 {
		if err := v.retry(ctx, func() error { return v.flushOnce(ctx, true) }); err != nil {
			return err
		}
	}
	return nil
}

// flushOnce sends one flush to every connected shard and waits for
// enough acknowledgements, or with all for every shard's answer.
func (v *Volume) flushOnce(ctx context.Context, all bool) error {
	k := v.cfg.Layout.Data
	v.mu.Lock()
	if !v.started {
		v.mu.Unlock()
		return ErrNotActive
	}
	var sessions []*session
	var ids []int
	var current []bool
	for i, sh := range v.shards {
		if sh.sess != nil {
			sessions = append(sessions, sh.sess)
			ids = append(ids, i)
			current = append(current, sh.missed.count == 0)
			if sh.missed.count == 0 {
				v.noteWrittenLocked(sh, v.metaBlock, v.metaBlock)
			}
		}
	}
	if len(sessions) < k {
		v.mu.Unlock()
		return fmt.Errorf("%w: %d shards connected for a flush", errRetry, len(sessions))
	}
	v.flushNum++
	req := wire.Flush{FlushNumber: v.flushNum, Gen: v.gen}
	meta, at := shardMeta{Layout: v.cfg.Layout, Region: v.region.UUID, Gen: v.gen, Flush: v.flushNum}, v.metaBlock
	v.mu.Unlock()
	results := make(chan error, len(sessions))
	for x, s := range sessions {
		if current[x] {
			// A shard behind on nothing records this flush in its
			// metadata, ahead of the flush that makes it durable.
			m := meta
			m.Shard = ids[x]
			block := make([]byte, v.bs)
			m.encode(block)
			if _, err := s.start(&wire.Write{Offset: at, Hashes: []uint64{xxhash.Sum64(block)}, Data: block}, nil); err != nil {
				v.writeFailed(ids[x], s, err)
				results <- err
				continue
			}
		}
		f := req
		p, err := s.start(&f, nil)
		if err != nil {
			v.writeFailed(ids[x], s, err)
			results <- err
			continue
		}
		if !v.goIO(func() {
			rctx, cancel := context.WithTimeout(v.ctx, v.cfg.ReplyTimeout)
			defer cancel()
			_, err := s.wait(rctx, p)
			if err != nil {
				v.writeFailed(ids[x], s, err)
			}
			results <- err
		}) {
			results <- ErrClosed
		}
	}
	acks := 0
	for range sessions {
		var err error
		select {
		case err = <-results:
		case <-ctx.Done():
			return ctx.Err()
		}
		if errors.Is(err, ErrFenced) {
			return err
		}
		if err == nil {
			acks++
			if !all && v.enough([]int{acks}) {
				return nil
			}
		}
	}
	if v.enough([]int{acks}) {
		return nil
	}
	return fmt.Errorf("%w: flush acknowledged by %d shards", errRetry, acks)
}
