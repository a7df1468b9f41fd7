package extent

import (
	"fmt"
	"tern/volume/ids"

	"github.com/cespare/xxhash/v2"
)

// verifyChunkBytes is how much block data open-time verification reads at
// once.
const verifyChunkBytes = 1 << 20

// verifier holds one loading goroutine's buffers for verifying dirty
// extents; they are allocated on first use.
type verifier struct {
	data []byte
	meta []byte
}

// loadExtent opens extent id's file, reads its trailer and, if the extent
// is dirty or its trailer unreadable, verifies every block against its
// recorded hash. The returned extent is non-nil whenever its file was
// opened, so the caller can close it on error.
func (r *Region) loadExtent(id ids.ExtentID, v *verifier) (*extent, error) {
	f, err := r.fsys.OpenFile(extentFileName(id), r.readOnly)
	if isNotExist(err) {
		return nil, fmt.Errorf("%w: extent %d: %w", ErrBadRegion, id, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open extent %d: %w", id, classify(err))
	}
	e := &extent{id: id, file: f}
	size, err := f.Size()
	if err != nil {
		return e, fmt.Errorf("stat extent %d: %w", id, err)
	}
	if size != r.lay.fileSize {
		return e, fmt.Errorf("%w: extent %d is %d bytes, want %d", ErrBadRegion, id, size, r.lay.fileSize)
	}
	var buf [trailerSize]byte
	if err := preadFull(e.file, buf[:], r.lay.trailerOff); err != nil {
		return e, fmt.Errorf("read extent %d trailer: %w", id, err)
	}
	t, ok := decodeTrailer(buf[:], id)
	switch {
	case !ok:
		// A torn or garbled trailer vouches for nothing: treat the extent
		// as dirty, with no flush or generation, so reconciliation prefers
		// any peer. e.dirty stays false so the first write rewrites a
		// proper dirty trailer before touching data.
		e.ver = Version{Dirty: true}
	case t.ver.Dirty:
		e.ver = t.ver
		e.dirty.Store(true)
	default:
		e.ver = t.ver
		e.seq.Store(t.seq)
		return e, nil
	}
	maxSeq, err := r.verifyExtent(e, v)
	if err != nil {
		return e, err
	}
	e.seq.Store(max(t.seq, maxSeq))
	return e, nil
}

// verifyExtent reads every block of e, compares it with its recorded hash
// and marks the blocks that differ corrupt. It returns the largest write
// counter in e's metadata.
func (r *Region) verifyExtent(e *extent, v *verifier) (maxSeq uint64, err error) {
	bs := int(r.lay.blockSize)
	chunk := uint32(max(verifyChunkBytes/bs, 1))
	if v.data == nil {
		v.data = make([]byte, int(chunk)*bs)
		v.meta = make([]byte, int(chunk)*metaEntrySize)
	}
	for first := uint32(0); first < r.lay.blocks; first += chunk {
		n := min(chunk, r.lay.blocks-first)
		data := v.data[:int(n)*bs]
		meta := v.meta[:int(n)*metaEntrySize]
		if err := preadFull(e.file, data, r.lay.dataOff(first)); err != nil {
			return 0, fmt.Errorf("verify extent %d data: %w", e.id, err)
		}
		if err := preadFull(e.file, meta, r.lay.metaEntryOff(first)); err != nil {
			return 0, fmt.Errorf("verify extent %d metadata: %w", e.id, err)
		}
		for i := range n {
			hash, seq := getMeta(meta[int(i)*metaEntrySize:], r.zeroHash)
			maxSeq = max(maxSeq, seq)
			if xxhash.Sum64(data[int(i)*bs:int(i+1)*bs]) != hash {
				e.markCorrupt(first+i, 1)
			}
		}
	}
	return maxSeq, nil
}
