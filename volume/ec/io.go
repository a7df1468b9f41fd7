package ec

import (
	"context"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"

	"tern/volume/wire"
)

// errRetry: the IO could not reach enough shards this time; it waits for
// a shard to come back and tries again.
var errRetry = errors.New("too few shards took the IO")

// ErrNotActive: IO before Activate finished.
var ErrNotActive = errors.New("volume not activated")

// ReadAt reads len(p) bytes at off; both must be multiples of the block
// size. A data block whose shard is unreachable, slow (no answer within
// Config.ReplyTimeout) or whose data fails its hash is reconstructed from
// any Layout.Data blocks of its stripe, and the shard is scheduled for
// repair. With fewer than Layout.Data shards intact for a stripe, the
// read waits until enough are back or ctx ends.
func (v *Volume) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	return v.chunked(ctx, p, off, false, v.readChunk)
}

// WriteAt writes p at off (multiples of the block size). It returns once
// Layout.Data+1 shards hold each stripe's new content (fewer only when
// fewer are reachable, never fewer than Layout.Data): the shards written
// that acknowledged, and the untouched ones that were already current.
// A full stripe is encoded and sent to every shard; a partial one reads
// the rest of its data blocks first (read-modify-write) and sends the
// changed data blocks and every parity block. Below Layout.Data reachable
// shards it waits until enough are back or ctx ends.
func (v *Volume) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	return v.chunked(ctx, p, off, true, v.writeChunk)
}

// chunked checks the request and hands it to do in pieces whose per-shard
// requests fit one frame, each under its stripes' locks.
func (v *Volume) chunked(ctx context.Context, p []byte, off int64, exclusive bool,
	do func(ctx context.Context, p []byte, first uint64, count uint64) error) (int, error) {
	v.mu.Lock()
	bs, running, stop := v.bs, v.running, v.stopErr
	if v.closing {
		stop = ErrClosed
	}
	total := v.cfg.Layout.VolumeBlocks(v.stripes)
	v.mu.Unlock()
	if stop != nil {
		return 0, stop
	}
	if !running {
		return 0, ErrNotActive
	}
	if off < 0 || len(p)%bs != 0 || off%int64(bs) != 0 {
		return 0, fmt.Errorf("io at %d of %d bytes: not aligned to the %d-byte block", off, len(p), bs)
	}
	first, count := uint64(off)/uint64(bs), uint64(len(p)/bs)
	if first+count > total {
		return 0, fmt.Errorf("io at %d of %d bytes: past the end of the %d-byte volume", off, len(p), total*uint64(bs))
	}
	k := uint64(v.cfg.Layout.Data)
	maxStripes := uint64(wire.MaxDataSize / bs)
	done := 0
	for count > 0 {
		// Up to maxStripes stripes, ending on a stripe boundary when
		// more follows.
		end := min(first+count, (first/k+maxStripes)*k)
		n := end - first
		s0, s1 := first/k, (end-1)/k
		// The stripes are locked for each attempt, not while waiting for
		// shards: the repair that brings them back needs those locks.
		err := v.retry(ctx, func() error {
			unlock, err := v.locks.lock(ctx, StripeIndex(s0), StripeIndex(s1), exclusive)
			if err != nil {
				return err
			}
			defer unlock()
			return do(ctx, p[:n*uint64(bs)], first, n)
		})
		if err != nil {
			return done, err
		}
		p = p[n*uint64(bs):]
		done += int(n) * bs
		first += n
		count -= n
	}
	return done, nil
}

// retry runs do until it neither returns errRetry nor ErrTooFewShards,
// waiting for a change of shard states between attempts.
func (v *Volume) retry(ctx context.Context, do func() error) error {
	for {
		v.mu.Lock()
		ch, stop := v.stateCh, v.stopErr
		v.mu.Unlock()
		if stop != nil {
			return stop
		}
		err := do()
		if !errors.Is(err, errRetry) && !errors.Is(err, ErrTooFewShards) {
			return err
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%w: %w (%v)", ErrNotEnoughShards, ctx.Err(), err)
		}
	}
}

func (v *Volume) readChunk(ctx context.Context, p []byte, first, count uint64) error {
	return v.readBlocks(ctx, p, first, count)
}

// readBlocks reads client blocks [first, first+count) into p; the caller
// holds their stripes' locks.
func (v *Volume) readBlocks(ctx context.Context, p []byte, first, count uint64) error {
	l, bs := v.cfg.Layout, v.bs
	k := uint64(l.Data)
	s0, s1 := StripeIndex(first/k), StripeIndex((first+count-1)/k)
	want := make([]bool, l.Shards())
	for b := first; b < first+count && b < first+k; b++ {
		want[b%k] = true
	}
	rd := v.readStripes(ctx, s0, s1, want)
	// Blocks that did not come back intact are reconstructed, stripe by
	// stripe, from every other shard.
	var bad []StripeIndex
	for b := first; b < first+count; b++ {
		st, d := l.Locate(StripeIndex(b))
		if !rd.ok(d, st) && (len(bad) == 0 || bad[len(bad)-1] != st) {
			bad = append(bad, st)
		}
	}
	var more *stripeRead
	if len(bad) > 0 {
		others := make([]bool, l.Shards())
		for i := range others {
			others[i] = !want[i]
		}
		more = v.readStripes(ctx, bad[0], bad[len(bad)-1], others)
	}
	fixed := map[StripeIndex][][]byte{}
	for _, st := range bad {
		stripe := make([][]byte, l.Shards())
		for i := range stripe {
			if b := rd.block(i, st); b != nil {
				stripe[i] = b
			} else if b := more.block(i, st); b != nil {
				stripe[i] = b
			}
		}
		if err := v.codec.ReconstructData(stripe); err != nil {
			return fmt.Errorf("reading stripe %d: %w", st, err)
		}
		fixed[st] = stripe
	}
	for b := first; b < first+count; b++ {
		st, d := l.Locate(StripeIndex(b))
		dst := p[(b-first)*uint64(bs) : (b-first+1)*uint64(bs)]
		if stripe := fixed[st]; stripe != nil {
			copy(dst, stripe[d])
		} else {
			copy(dst, rd.block(d, st))
		}
	}
	return nil
}

// stripeRead is what readStripes read of stripes [first, last]: per shard
// the blocks, and which are intact (came back, matched their hash, and
// the shard is not behind on that stripe).
type stripeRead struct {
	first, last StripeIndex
	bs          int
	data        [][]byte
	intact      [][]bool
	// hashOK is whether each block came back matching its recorded hash,
	// whether or not its shard is behind on the stripe.
	hashOK [][]bool
	// recorded is each block's hash as its shard recorded it.
	recorded [][]uint64
}

// recordedHash is shard i's recorded hash of its block of stripe st;
// false when unknown (not read, or refused as damaged).
func (r *stripeRead) recordedHash(i int, st StripeIndex) (uint64, bool) {
	if r == nil || st < r.first || st > r.last || r.recorded[i] == nil {
		return 0, false
	}
	h := r.recorded[i][st-r.first]
	return h, h != noHash
}

func (r *stripeRead) ok(i int, st StripeIndex) bool {
	return r != nil && st >= r.first && st <= r.last && r.intact[i] != nil && r.intact[i][st-r.first]
}

// raw is shard i's block of stripe st if it came back matching its hash,
// trusted or not; nil otherwise.
func (r *stripeRead) raw(i int, st StripeIndex) []byte {
	if r == nil || st < r.first || st > r.last || r.hashOK[i] == nil || !r.hashOK[i][st-r.first] {
		return nil
	}
	j := int(st - r.first)
	return r.data[i][j*r.bs : (j+1)*r.bs]
}

// block is shard i's block of stripe st, nil unless intact.
func (r *stripeRead) block(i int, st StripeIndex) []byte {
	if !r.ok(i, st) {
		return nil
	}
	j := int(st - r.first)
	return r.data[i][j*r.bs : (j+1)*r.bs]
}

// readStripes reads stripes [first, last] from each wanted shard that is
// connected, in parallel. A block failing its hash marks the shard behind
// on that stripe (its repair loop rewrites it); a shard that fails the
// request or does not answer in time is dropped.
func (v *Volume) readStripes(ctx context.Context, first, last StripeIndex, want []bool) *stripeRead {
	n, cnt := len(want), int(last-first+1)
	r := &stripeRead{first: first, last: last, bs: v.bs, data: make([][]byte, n), intact: make([][]bool, n), hashOK: make([][]bool, n), recorded: make([][]uint64, n)}
	sessions := make([]*session, n)
	v.mu.Lock()
	for i, sh := range v.shards {
		if want[i] && sh.sess != nil {
			sessions[i] = sh.sess
			r.intact[i] = make([]bool, cnt)
			for j := range cnt {
				r.intact[i][j] = !sh.missed.has(first + StripeIndex(j))
			}
		}
	}
	v.mu.Unlock()
	done := make(chan struct{}, n)
	launched := 0
	for i, s := range sessions {
		if s == nil {
			continue
		}
		launched++
		r.data[i] = make([]byte, cnt*v.bs)
		go func() {
			defer func() { done <- struct{}{} }()
			hashOK, recorded, err := v.shardRead(ctx, i, s, first, cnt, r.data[i])
			if errors.Is(err, wire.CodeCorruptBlock) && cnt > 1 {
				// The shard refused the batch for a block it knows is
				// damaged: read the others one by one, so that one block
				// hides only itself.
				hashOK, recorded, err = v.shardReadEach(ctx, i, s, first, cnt, r.data[i])
			}
			if err != nil {
				r.intact[i] = nil
				return
			}
			r.hashOK[i], r.recorded[i] = hashOK, recorded
			var corrupt []StripeIndex
			for j, ok := range hashOK {
				if !ok {
					corrupt = append(corrupt, first+StripeIndex(j))
				}
				r.intact[i][j] = r.intact[i][j] && ok
			}
			if len(corrupt) > 0 {
				v.markCorrupt(i, corrupt)
			}
		}()
	}
	for range launched {
		<-done
	}
	return r
}

// shardReadEach reads count blocks at stripe first from shard i one at a
// time: a block the shard refuses as damaged is reported failing its
// hash, with no recorded hash (noHash).
func (v *Volume) shardReadEach(ctx context.Context, i int, s *session, first StripeIndex, count int, buf []byte) ([]bool, []uint64, error) {
	ok, recorded := make([]bool, count), make([]uint64, count)
	for j := range count {
		o, rec, err := v.shardRead(ctx, i, s, first+StripeIndex(j), 1, buf[j*v.bs:(j+1)*v.bs])
		switch {
		case errors.Is(err, wire.CodeCorruptBlock):
			recorded[j] = noHash
		case err != nil:
			return nil, nil, err
		default:
			ok[j], recorded[j] = o[0], rec[0]
		}
	}
	return ok, recorded, nil
}

// noHash stands for a recorded hash a shard could not give (its block is
// marked damaged). A block whose xxhash64 it is could be taken for
// recorded, a chance of one in 2^64.
const noHash = ^uint64(0)

// shardRead reads count blocks at stripe first from shard i into buf and
// reports which match the hash the shard recorded for them, and those
// recorded hashes.
func (v *Volume) shardRead(ctx context.Context, i int, s *session, first StripeIndex, count int, buf []byte) ([]bool, []uint64, error) {
	rctx, cancel := context.WithTimeout(ctx, v.cfg.ReplyTimeout)
	m, err := s.call(rctx, &wire.Read{Offset: first, Count: uint32(count)}, buf)
	cancel()
	if err != nil {
		if ctx.Err() == nil {
			// Slow, gone or refusing: its blocks are reconstructed.
			if errors.Is(err, context.DeadlineExceeded) {
				v.dropShard(v.shards[i], s, fmt.Errorf("no answer to a read within %v", v.cfg.ReplyTimeout))
			}
		}
		return nil, nil, err
	}
	resp, _ := m.(*wire.ReadResponse)
	if resp == nil || len(resp.Hashes) != count || len(resp.Data) != count*v.bs {
		err := fmt.Errorf("shard %d answered a read of %d blocks with %v", i, count, m.Type())
		v.dropShard(v.shards[i], s, err)
		return nil, nil, err
	}
	if &resp.Data[0] != &buf[0] {
		copy(buf, resp.Data)
	}
	ok := make([]bool, count)
	for j := range count {
		ok[j] = xxhash.Sum64(buf[j*v.bs:(j+1)*v.bs]) == resp.Hashes[j]
	}
	return ok, resp.Hashes, nil
}

// markCorrupt notes blocks of shard i that failed their hash and wakes
// its repair loop.
func (v *Volume) markCorrupt(i int, stripes []StripeIndex) {
	sh := v.shards[i]
	v.mu.Lock()
	for _, st := range stripes {
		sh.missed.add(st)
	}
	v.mu.Unlock()
	v.log.Warn("shard blocks fail their hash; reconstructing and repairing", "shard", i, "first_stripe", stripes[0], "blocks", len(stripes))
	sh.wake()
}

func (sh *shard) wake() {
	select {
	case sh.kick <- struct{}{}:
	default:
	}
}
