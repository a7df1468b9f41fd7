package extent

import (
	"fmt"
	"slices"
	"tern/volume/ids"
)

// checkExtentIO validates an IO of the listed extent-relative blocks of
// extent e.
func (r *Region) checkExtentIO(e ids.ExtentID, blocks []uint32, p []byte, hashes []uint64) error {
	if uint64(e) >= uint64(r.spec.ExtentCount) {
		return fmt.Errorf("%w: extent %d of %d", ErrOutOfRange, e, r.spec.ExtentCount)
	}
	bs := uint64(r.spec.BlockSize)
	if len(hashes) != len(blocks) || uint64(len(p)) != uint64(len(blocks))*bs {
		return fmt.Errorf("%w: %d bytes and %d hashes for %d blocks of %d bytes", ErrUnaligned, len(p), len(hashes), len(blocks), bs)
	}
	for _, b := range blocks {
		if b >= r.spec.ExtentBlocks {
			return fmt.Errorf("%w: block %d of extent %d (%d blocks)", ErrOutOfRange, b, e, r.spec.ExtentBlocks)
		}
	}
	return nil
}

// nextRun returns the length of the run of consecutive block numbers at
// the start of blocks.
func nextRun(blocks []uint32) int {
	n := 1
	for n < len(blocks) && blocks[n] == blocks[n-1]+1 {
		n++
	}
	return n
}

// ExtentHashes returns the recorded hash of every block of extent e,
// stored into dst[:0] (dst is reused when it has the capacity). A
// never-written block reports the hash of a zero block. A corrupt block
// reports the bitwise complement of its recorded hash, so a block-by-block
// comparison with a healthy peer sees it differ and copies it;
// ExtentCorruptBlocks lists them explicitly.
func (r *Region) ExtentHashes(e ids.ExtentID, dst []uint64) ([]uint64, error) {
	if uint64(e) >= uint64(r.spec.ExtentCount) {
		return dst[:0], fmt.Errorf("get extent %d hashes: %w", e, ErrOutOfRange)
	}
	if err := r.begin(); err != nil {
		return dst[:0], fmt.Errorf("get extent %d hashes: %w", e, err)
	}
	defer r.end()
	ext := r.extents[e]
	dst = slices.Grow(dst[:0], int(r.spec.ExtentBlocks))[:r.spec.ExtentBlocks]
	if err := r.readMeta(ext, 0, dst); err != nil {
		return dst[:0], fmt.Errorf("get extent %d hashes: %w", e, err)
	}
	for _, b := range ext.corruptList() {
		dst[b] = ^dst[b]
	}
	return dst, nil
}

// ExtentCorruptBlocks returns extent e's corrupt blocks (extent-relative),
// in ascending order.
func (r *Region) ExtentCorruptBlocks(e ids.ExtentID) ([]uint32, error) {
	if uint64(e) >= uint64(r.spec.ExtentCount) {
		return nil, fmt.Errorf("get extent %d corrupt blocks: %w", e, ErrOutOfRange)
	}
	out := r.extents[e].corruptList()
	slices.Sort(out)
	return out, nil
}

// ReadExtentBlocks reads the listed extent-relative blocks of extent e
// into p (len(blocks)*BlockSize bytes, in the order listed) and their
// recorded hashes into hashes; the repair source uses it. A corrupt block
// fails the read with ErrCorruptBlock: a corrupt block is never a repair
// source.
func (r *Region) ReadExtentBlocks(e ids.ExtentID, blocks []uint32, p []byte, hashes []uint64) error {
	if err := r.checkExtentIO(e, blocks, p, hashes); err != nil {
		return fmt.Errorf("read extent %d blocks: %w", e, err)
	}
	if err := r.begin(); err != nil {
		return fmt.Errorf("read extent %d blocks: %w", e, err)
	}
	defer r.end()
	ext := r.extents[e]
	bs := int(r.spec.BlockSize)
	for len(blocks) > 0 {
		n := nextRun(blocks)
		if err := r.readRun(ext, blocks[0], p[:n*bs], hashes[:n]); err != nil {
			return fmt.Errorf("read extent %d blocks: %w", e, err)
		}
		blocks, p, hashes = blocks[n:], p[n*bs:], hashes[n:]
	}
	return nil
}

// RepairExtent writes the listed extent-relative blocks of extent e from p
// (verifying each against hashes first, as WriteBlocks does), makes them
// durable, and then durably sets the extent's trailer to v. The extent's
// trailer is made dirty before any block is written, so an interrupted
// repair leaves the extent dirty (verified at Open, and different from the
// source under reconciliation) and a retry redoes it; a completed one
// leaves the extent's data, hashes and version as the source's. If blocks
// remain corrupt that the repair did not write, the trailer is stored
// dirty whatever v says, so they are never trusted.
func (r *Region) RepairExtent(e ids.ExtentID, blocks []uint32, p []byte, hashes []uint64, v Version) error {
	if err := r.checkExtentIO(e, blocks, p, hashes); err != nil {
		return fmt.Errorf("repair extent %d: %w", e, err)
	}
	bs := int(r.spec.BlockSize)
	for i, b := range blocks {
		if err := r.verifyHashes(r.blockIndex(e, b), p[i*bs:(i+1)*bs], hashes[i:i+1]); err != nil {
			return fmt.Errorf("repair extent %d: %w", e, err)
		}
	}
	if err := r.begin(); err != nil {
		return fmt.Errorf("repair extent %d: %w", e, err)
	}
	defer r.end()
	if r.readOnly {
		return fmt.Errorf("repair extent %d: %w", e, ErrReadOnly)
	}
	if err := r.repairLocked(r.extents[e], blocks, p, hashes, v); err != nil {
		return fmt.Errorf("repair extent %d: %w", e, err)
	}
	return nil
}

// repairLocked does RepairExtent's work with ext.io held exclusively, so
// the new trailer covers exactly the repaired state.
func (r *Region) repairLocked(ext *extent, blocks []uint32, p []byte, hashes []uint64, v Version) error {
	ext.io.Lock()
	defer ext.io.Unlock()
	if err := r.ensureDirty(ext); err != nil {
		return err
	}
	bs := int(r.spec.BlockSize)
	for len(blocks) > 0 {
		n := nextRun(blocks)
		if err := r.writeBlocksLocked(ext, blocks[0], p[:n*bs], hashes[:n]); err != nil {
			return err
		}
		ext.clearCorrupt(blocks[0], uint32(n))
		blocks, p, hashes = blocks[n:], p[n*bs:], hashes[n:]
	}
	if err := r.fault(stepRepairWritten); err != nil {
		return err
	}
	if v.Dirty && ext.carries(v) {
		// An intermediate batch of a multi-batch repair: the extent stays
		// dirty at the version its trailer already holds durably. Its data
		// needs no sync yet (a crash leaves the extent dirty, so Open
		// checks every block against its hash); the last batch syncs all
		// of it before it stamps the final version.
		return nil
	}
	if err := fdatasync(ext.file); err != nil {
		return fmt.Errorf("sync extent %d: %w", ext.id, err)
	}
	ext.trailerMu.Lock()
	defer ext.trailerMu.Unlock()
	if ext.corruptCount.Load() > 0 {
		v.Dirty = true
	}
	ext.dirty.Store(false)
	if err := ext.writeTrailerLocked(r.lay, trailer{id: ext.id, ver: v, seq: ext.seq.Load()}); err != nil {
		ext.ver.Dirty = true
		return err
	}
	ext.ver = v
	ext.dirty.Store(v.Dirty)
	return nil
}

// carries reports whether the extent's durable trailer is v and dirty.
func (ext *extent) carries(v Version) bool {
	ext.trailerMu.Lock()
	defer ext.trailerMu.Unlock()
	return ext.dirty.Load() && ext.ver == v
}
