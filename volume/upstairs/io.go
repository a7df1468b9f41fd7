package upstairs

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"tern/volume/ids"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// ioHooks are test callbacks at fixed points of the IO path, each run
// with Upstairs.mu released; a nil field (or nil *ioHooks) is skipped.
type ioHooks struct {
	// sendPicked runs when replica r's sender has taken job id to send
	// (before encoding it), or found nothing it may send (id 0).
	sendPicked func(r int, id wire.JobID)
	// privatizing runs before write id's data is copied out of the
	// caller's buffer.
	privatizing func(id wire.JobID)
}

var waiterPool = sync.Pool{New: func() any { return &waiter{ch: make(chan struct{}, 1)} }}

// WriteAt writes p at byte offset off, both multiples of the block size.
// It returns once two replicas have applied every block (the third follows
// from a private copy if it lags), so p may be reused as soon as it
// returns. It blocks while too much IO is in flight, and fails only when
// fewer than two replicas can take the write.
func (u *Upstairs) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	start := time.Now()
	err := u.do(ctx, engine.KindWrite, p, off)
	u.met.observe(engine.KindWrite, len(p), start, err)
	if err != nil {
		return 0, fmt.Errorf("writing %d bytes at %d: %w", len(p), off, err)
	}
	return len(p), nil
}

// ReadAt reads len(p) bytes at byte offset off, both multiples of the block
// size, straight into p. Each block is verified against its recorded hash;
// a replica returning a bad block is bypassed (and the block rewritten from
// good data). A read never returns data older than a write already
// acknowledged.
func (u *Upstairs) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	start := time.Now()
	err := u.do(ctx, engine.KindRead, p, off)
	u.met.observe(engine.KindRead, len(p), start, err)
	if err != nil {
		return 0, fmt.Errorf("reading %d bytes at %d: %w", len(p), off, err)
	}
	return len(p), nil
}

// Flush makes every write acknowledged before it durable on at least two
// replicas.
func (u *Upstairs) Flush(ctx context.Context) error {
	start := time.Now()
	err := u.do(ctx, engine.KindFlush, nil, 0)
	u.met.observe(engine.KindFlush, 0, start, err)
	if err != nil {
		return fmt.Errorf("flushing volume: %w", err)
	}
	return nil
}

// do submits one caller IO, split into jobs of at most wire.MaxDataSize
// that do not cross extents, and waits for all of them.
func (u *Upstairs) do(ctx context.Context, kind engine.JobKind, p []byte, off int64) error {
	return u.doWith(ctx, kind, p, off, false)
}

// backgroundFlush flushes after a repair, without waiting for room (see
// waiter.background).
func (u *Upstairs) backgroundFlush(ctx context.Context) error {
	if err := u.doWith(ctx, engine.KindFlush, nil, 0, true); err != nil {
		return fmt.Errorf("flushing volume: %w", err)
	}
	return nil
}

func (u *Upstairs) doWith(ctx context.Context, kind engine.JobKind, p []byte, off int64, background bool) error {
	return u.doOn(ctx, kind, p, off, background, -1)
}

// doOn is doWith, reads served first by replica scrub when it is not -1.
func (u *Upstairs) doOn(ctx context.Context, kind engine.JobKind, p []byte, off int64, background bool, scrub int) error {
	w := waiterPool.Get().(*waiter)
	w.background, w.scrub = background, scrub+1
	defer func() {
		w.pending, w.err, w.ids, w.background, w.scrub = 0, nil, w.ids[:0], false, 0
		waiterPool.Put(w)
	}()
	u.mu.Lock()
	bs := int64(u.blockSize)
	if err := u.checkIOLocked(kind, p, off); err != nil || kind != engine.KindFlush && len(p) == 0 {
		u.mu.Unlock()
		return err
	}
	if kind == engine.KindWrite {
		// Hash outside the lock, into the waiter's reused array.
		u.mu.Unlock()
		blocks := len(p) / int(bs)
		if cap(w.hashes) < blocks {
			w.hashes = make([]uint64, blocks)
		}
		w.hashes = w.hashes[:blocks]
		hashBlocks(w.hashes, p, int(bs))
		u.mu.Lock()
	}
	w.pending = 1 // held until every job is submitted
	var err error
	if kind == engine.KindFlush {
		err = u.submitLocked(ctx, w, engine.KindFlush, nil, nil, 0)
	} else {
		extentBytes := int64(u.region.ExtentBlocks) * bs
		for pos := int64(0); pos < int64(len(p)) && err == nil; {
			at := off + pos
			n := min(int64(len(p))-pos, wire.MaxDataSize, extentBytes-at%extentBytes)
			var hashes []uint64
			if kind == engine.KindWrite {
				hashes = w.hashes[pos/bs : (pos+n)/bs]
			}
			err = u.submitLocked(ctx, w, kind, p[pos:pos+n], hashes, ids.BlockIndex(at/bs))
			pos += n
		}
	}
	w.pending--
	if w.pending == 0 {
		u.finishLocked()
		return errors.Join(err, w.err)
	}
	if err != nil && ctx.Err() != nil {
		// Backpressure wait was cancelled: release what was submitted.
		for _, id := range w.ids {
			u.eng.Abandon(id)
		}
		u.stepLocked()
	}
	u.finishLocked()
	select {
	case <-w.ch:
	case <-ctx.Done():
		u.mu.Lock()
		for _, id := range w.ids {
			u.eng.Abandon(id)
		}
		u.stepLocked()
		u.finishLocked()
		<-w.ch
	}
	if err == nil {
		err = w.err
	}
	if errors.Is(err, engine.ErrAbandoned) {
		err = ctx.Err()
	}
	return err
}

// checkIOLocked validates an IO against the activated region.
func (u *Upstairs) checkIOLocked(kind engine.JobKind, p []byte, off int64) error {
	if err := u.eng.SubmitErr(kind); err != nil {
		return err
	}
	if kind == engine.KindFlush {
		return nil
	}
	if u.closing {
		return ErrClosed
	}
	bs := int64(u.blockSize)
	if off%bs != 0 || int64(len(p))%bs != 0 {
		return fmt.Errorf("offset %d, length %d, block size %d: %w", off, len(p), bs, ErrUnaligned)
	}
	if size := int64(u.region.Blocks()) * bs; off < 0 || off+int64(len(p)) > size {
		return fmt.Errorf("offset %d, length %d, volume size %d: %w", off, len(p), size, ErrOutOfRange)
	}
	return nil
}

// submitLocked waits for room (backpressure), then submits one job for
// waiter w.
func (u *Upstairs) submitLocked(ctx context.Context, w *waiter, kind engine.JobKind, data []byte, hashes []uint64, first ids.BlockIndex) error {
	for !w.background && u.eng.Full(len(data)) {
		u.spaceWaiters++
		ch := u.spaceCh
		u.finishLocked()
		select {
		case <-ch:
		case <-ctx.Done():
			u.mu.Lock()
			return ctx.Err()
		}
		u.mu.Lock()
	}
	var id wire.JobID
	var err error
	blocks := uint32(len(data) / max(u.blockSize, 1))
	switch kind {
	case engine.KindWrite:
		id, err = u.eng.SubmitWrite(first, blocks, len(data))
	case engine.KindRead:
		if w.scrub > 0 {
			id, err = u.eng.SubmitScrubRead(w.scrub-1, first, blocks, len(data))
		} else {
			id, err = u.eng.SubmitRead(first, blocks, len(data))
		}
	default:
		id, err = u.eng.SubmitFlush()
	}
	if err != nil {
		return err
	}
	rec := u.pools.record()
	rec.data, rec.hashes, rec.waiter, rec.start = data, hashes, w, first
	u.recs[id] = rec
	w.pending++
	w.ids = append(w.ids, id)
	u.stepLocked()
	return nil
}
