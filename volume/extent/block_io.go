package extent

import (
	"fmt"
	"tern/volume/ids"

	"github.com/cespare/xxhash/v2"
)

// checkIO validates a region-wide IO of len(hashes) blocks at first.
func (r *Region) checkIO(first ids.BlockIndex, p []byte, hashes []uint64) error {
	bs := uint64(r.spec.BlockSize)
	if uint64(len(p))%bs != 0 || uint64(len(p))/bs != uint64(len(hashes)) {
		return fmt.Errorf("%w: %d bytes for %d hashes of %d-byte blocks", ErrUnaligned, len(p), len(hashes), bs)
	}
	total := r.spec.Blocks()
	if uint64(first) > total || uint64(len(hashes)) > total-uint64(first) {
		return fmt.Errorf("%w: blocks [%d, %d) in a region of %d", ErrOutOfRange, first, uint64(first)+uint64(len(hashes)), total)
	}
	return nil
}

// ReadBlocks reads len(hashes) blocks starting at first into p, which must
// be len(hashes)*BlockSize bytes, and stores each block's recorded xxhash64
// in hashes; the caller verifies data against them. A block marked corrupt
// fails the read with a *BlockError wrapping ErrCorruptBlock (p may then be
// partly filled). Never-written blocks read as zeros.
func (r *Region) ReadBlocks(first ids.BlockIndex, p []byte, hashes []uint64) error {
	if err := r.checkIO(first, p, hashes); err != nil {
		return fmt.Errorf("read blocks: %w", err)
	}
	if err := r.begin(); err != nil {
		return fmt.Errorf("read blocks: %w", err)
	}
	defer r.end()
	eb := uint64(r.spec.ExtentBlocks)
	bs := uint64(r.spec.BlockSize)
	b := uint64(first)
	for len(hashes) > 0 {
		e := r.extents[b/eb]
		off := uint32(b % eb)
		n := min(uint64(len(hashes)), eb-uint64(off))
		if err := r.readRun(e, off, p[:n*bs], hashes[:n]); err != nil {
			return fmt.Errorf("read blocks: %w", err)
		}
		p, hashes, b = p[n*bs:], hashes[n:], b+n
	}
	return nil
}

// WriteBlocks writes len(hashes) blocks starting at first from p, which
// must be len(hashes)*BlockSize bytes. hashes are the xxhash64 values the
// upstairs computed; if any block's data differs from its hash the whole
// write is rejected with a *BlockError wrapping ErrHashMismatch before
// anything is written. A successful write clears any corrupt mark on its
// blocks. The write is durable only after the next Flush. p must not change
// during the call.
func (r *Region) WriteBlocks(first ids.BlockIndex, p []byte, hashes []uint64) error {
	if err := r.checkIO(first, p, hashes); err != nil {
		return fmt.Errorf("write blocks: %w", err)
	}
	if err := r.verifyHashes(first, p, hashes); err != nil {
		return fmt.Errorf("write blocks: %w", err)
	}
	if err := r.begin(); err != nil {
		return fmt.Errorf("write blocks: %w", err)
	}
	defer r.end()
	if r.readOnly {
		return fmt.Errorf("write blocks: %w", ErrReadOnly)
	}
	eb := uint64(r.spec.ExtentBlocks)
	bs := uint64(r.spec.BlockSize)
	b := uint64(first)
	for len(hashes) > 0 {
		e := r.extents[b/eb]
		off := uint32(b % eb)
		n := min(uint64(len(hashes)), eb-uint64(off))
		if err := r.writeRun(e, off, p[:n*bs], hashes[:n]); err != nil {
			return fmt.Errorf("write blocks: %w", err)
		}
		p, hashes, b = p[n*bs:], hashes[n:], b+n
	}
	return nil
}

// verifyHashes checks every block of p against the caller's hash; first
// names the first block in errors.
func (r *Region) verifyHashes(first ids.BlockIndex, p []byte, hashes []uint64) error {
	bs := int(r.spec.BlockSize)
	for i, want := range hashes {
		if xxhash.Sum64(p[i*bs:(i+1)*bs]) != want {
			return &BlockError{Block: first + ids.BlockIndex(i), Err: ErrHashMismatch}
		}
	}
	return nil
}

// readRun reads blocks [off, off+len(hashes)) of one extent. It takes no
// extent lock: a read never waits behind a Flush of its extent, and the
// caller orders reads against overlapping writes and repairs.
func (r *Region) readRun(e *extent, off uint32, p []byte, hashes []uint64) error {
	if b, bad := e.firstCorrupt(off, uint32(len(hashes))); bad {
		return &BlockError{Block: r.blockIndex(e.id, b), Err: ErrCorruptBlock}
	}
	if err := preadFull(e.file, p, r.lay.dataOff(off)); err != nil {
		return fmt.Errorf("read extent %d data: %w", e.id, err)
	}
	return r.readMeta(e, off, hashes)
}

// readMeta fills hashes with the recorded hashes of blocks
// [off, off+len(hashes)) of e.
func (r *Region) readMeta(e *extent, off uint32, hashes []uint64) error {
	s := r.getScratch()
	defer r.putScratch(s)
	for len(hashes) > 0 {
		n := min(len(hashes), metaChunkBlocks)
		buf := s[:n*metaEntrySize]
		if err := preadFull(e.file, buf, r.lay.metaEntryOff(off)); err != nil {
			return fmt.Errorf("read extent %d metadata: %w", e.id, err)
		}
		for i := range n {
			hashes[i], _ = getMeta(buf[i*metaEntrySize:], r.zeroHash)
		}
		hashes, off = hashes[n:], off+uint32(n)
	}
	return nil
}

// writeRun writes blocks [off, off+len(hashes)) of one extent, following
// the crash rules in doc.go: dirty trailer durable first, then data, then
// metadata.
func (r *Region) writeRun(e *extent, off uint32, p []byte, hashes []uint64) error {
	e.io.RLock()
	defer e.io.RUnlock()
	if err := r.ensureDirty(e); err != nil {
		return err
	}
	n := uint32(len(hashes))
	if err := r.writeBlocksLocked(e, off, p, hashes); err != nil {
		return err
	}
	e.clearCorrupt(off, n)
	return nil
}

// writeBlocksLocked writes data then metadata of blocks
// [off, off+len(hashes)) of e, whose dirty trailer is durable; e.io is
// held. On failure the blocks are marked corrupt: their content on disk
// is unknown.
func (r *Region) writeBlocksLocked(e *extent, off uint32, p []byte, hashes []uint64) error {
	n := uint32(len(hashes))
	if err := r.fault(stepBeforeData); err != nil {
		return err
	}
	if err := pwriteFull(e.file, p, r.lay.dataOff(off)); err != nil {
		e.markCorrupt(off, n)
		return fmt.Errorf("write extent %d data: %w", e.id, err)
	}
	if err := r.fault(stepAfterData); err != nil {
		return err
	}
	if err := r.writeMeta(e, off, hashes); err != nil {
		e.markCorrupt(off, n)
		return err
	}
	return r.fault(stepAfterMeta)
}

// writeMeta records hashes and fresh write counters for blocks
// [off, off+len(hashes)) of e.
func (r *Region) writeMeta(e *extent, off uint32, hashes []uint64) error {
	seq := e.seq.Add(uint64(len(hashes))) - uint64(len(hashes))
	s := r.getScratch()
	defer r.putScratch(s)
	for len(hashes) > 0 {
		n := min(len(hashes), metaChunkBlocks)
		buf := s[:n*metaEntrySize]
		for i, h := range hashes[:n] {
			seq++
			putMeta(buf[i*metaEntrySize:], h, seq)
		}
		if err := pwriteFull(e.file, buf, r.lay.metaEntryOff(off)); err != nil {
			return fmt.Errorf("write extent %d metadata: %w", e.id, err)
		}
		hashes, off = hashes[n:], off+uint32(n)
	}
	return nil
}

// ensureDirty makes e's trailer durably dirty before its first write since
// a flush. e.io is held (shared or exclusive).
func (r *Region) ensureDirty(e *extent) error {
	if e.dirty.Load() {
		return nil
	}
	e.trailerMu.Lock()
	defer e.trailerMu.Unlock()
	if e.dirty.Load() {
		return nil
	}
	if err := r.fault(stepBeforeDirtyTrailer); err != nil {
		return err
	}
	v := e.ver
	v.Dirty = true
	if err := e.writeTrailerLocked(r.lay, trailer{id: e.id, ver: v, seq: e.seq.Load()}); err != nil {
		return err
	}
	e.ver = v
	e.dirty.Store(true)
	return nil
}
