package extent

import (
	"fmt"
	"sync"
	"sync/atomic"
	"tern/volume/ids"
)

// flushParallelism bounds how many extents one Flush syncs at once; the
// fdatasyncs of different files overlap in the device queue.
const flushParallelism = 8

// Flush makes every completed write durable and stamps the extents written
// since the last flush with Version{gen, flushNumber, Dirty: false}.
//
// As in Crucible, extents not written since the last flush keep their old
// flush and generation numbers: a flush costs in proportion to what was
// written, and a replica that missed a write to an extent (but saw the
// flush) is caught by reconciliation because its number for that extent
// stays behind.
//
// An extent with corrupt blocks is made durable but keeps its dirty
// trailer and old numbers, so it is verified again at the next Open and
// reconciliation repairs it from a peer rather than copying from it.
func (r *Region) Flush(flushNumber uint64, gen ids.Generation) error {
	if err := r.begin(); err != nil {
		return fmt.Errorf("flush region: %w", err)
	}
	defer r.end()
	if r.readOnly {
		return fmt.Errorf("flush region: %w", ErrReadOnly)
	}
	r.flushMu.Lock()
	defer r.flushMu.Unlock()
	list := r.flushList[:0]
	for _, e := range r.extents {
		if e.version().Dirty {
			list = append(list, e)
		}
	}
	r.flushList = list
	v := Version{Gen: gen, Flush: flushNumber}
	var err error
	if len(list) <= 1 {
		for _, e := range list {
			err = r.flushExtent(e, v)
		}
	} else {
		err = r.flushParallel(list, v)
	}
	if err != nil {
		return fmt.Errorf("flush region: %w", err)
	}
	r.lostWrites.Store(false)
	return nil
}

// flushParallel flushes list on up to flushParallelism goroutines and
// returns the first error; every extent is attempted regardless.
func (r *Region) flushParallel(list []*extent, v Version) error {
	var (
		wg    sync.WaitGroup
		next  atomic.Int64
		mu    sync.Mutex
		first error
	)
	for range min(flushParallelism, len(list)) {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(len(list)) {
					return
				}
				if err := r.flushExtent(list[i], v); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	return first
}

// flushExtent syncs e and, unless it holds corrupt blocks, durably writes
// the clean trailer v. Writers are excluded throughout so no write lands
// between the fdatasync and the trailer that vouches for it.
func (r *Region) flushExtent(e *extent, v Version) error {
	e.io.Lock()
	defer e.io.Unlock()
	// With e.io held exclusively only this goroutine changes the trailer;
	// trailerMu is taken for the trailer itself, so Versions waits for at
	// most one trailer write, not for the data sync.
	if !e.version().Dirty {
		return nil // cleaned meanwhile by RepairExtent
	}
	if err := fdatasync(e.file); err != nil {
		return fmt.Errorf("sync extent %d: %w", e.id, err)
	}
	if err := r.fault(stepFlushSynced); err != nil {
		return err
	}
	if e.corruptCount.Load() > 0 {
		return nil
	}
	e.trailerMu.Lock()
	defer e.trailerMu.Unlock()
	// Until the clean trailer is durable the on-disk dirty bit is unknown;
	// if writing it fails, the next write must rewrite a dirty trailer.
	e.dirty.Store(false)
	if err := e.writeTrailerLocked(r.lay, trailer{id: e.id, ver: v, seq: e.seq.Load()}); err != nil {
		return err
	}
	e.ver = v
	return nil
}
