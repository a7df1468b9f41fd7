package extent

import (
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"tern/volume/ids"
)

// extent is one open extent file and its in-memory state.
type extent struct {
	// Immutable after open.
	id   ids.ExtentID
	file File // owned

	// io is held shared by every write to the extent, and exclusively by
	// Flush and RepairExtent while they fdatasync the file and rewrite its
	// trailer: no write can land between the fdatasync and the clean
	// trailer that vouches for it. Reads do not take it.
	io sync.RWMutex

	// dirty mirrors the trailer's durable dirty bit: it becomes true only
	// after a dirty trailer has been fdatasync'd, and false only after a
	// clean one has. Loaded without locks on the write path; stored with
	// trailerMu held.
	dirty atomic.Bool
	// seq is the extent's write counter; each written block records the
	// value it got (see doc.go).
	seq atomic.Uint64
	// corruptCount is len(corrupt), so reads skip corruptMu when it is 0.
	corruptCount atomic.Int32

	// trailerMu serializes trailer writes and guards ver.
	trailerMu sync.Mutex
	ver       Version // the trailer as last made durable

	corruptMu sync.Mutex
	corrupt   map[uint32]struct{} // guarded by corruptMu; extent-relative blocks
}

// version returns the extent's trailer as last made durable.
func (e *extent) version() Version {
	e.trailerMu.Lock()
	defer e.trailerMu.Unlock()
	return e.ver
}

// writeTrailerLocked writes t and fdatasyncs it; e.trailerMu is held.
func (e *extent) writeTrailerLocked(lay layout, t trailer) error {
	var buf [trailerSize]byte
	t.encode(&buf)
	if err := pwriteFull(e.file, buf[:], lay.trailerOff); err != nil {
		return fmt.Errorf("write extent %d trailer: %w", e.id, err)
	}
	if err := fdatasync(e.file); err != nil {
		return fmt.Errorf("sync extent %d trailer: %w", e.id, err)
	}
	return nil
}

// firstCorrupt reports whether any of blocks [first, first+n) is marked
// corrupt, and the first such block.
func (e *extent) firstCorrupt(first, n uint32) (uint32, bool) {
	if e.corruptCount.Load() == 0 {
		return 0, false
	}
	e.corruptMu.Lock()
	defer e.corruptMu.Unlock()
	for b := first; b < first+n; b++ {
		if _, bad := e.corrupt[b]; bad {
			return b, true
		}
	}
	return 0, false
}

// markCorrupt marks blocks [first, first+n) corrupt.
func (e *extent) markCorrupt(first, n uint32) {
	e.corruptMu.Lock()
	defer e.corruptMu.Unlock()
	if e.corrupt == nil {
		e.corrupt = make(map[uint32]struct{})
	}
	for b := first; b < first+n; b++ {
		e.corrupt[b] = struct{}{}
	}
	e.corruptCount.Store(int32(len(e.corrupt)))
}

// clearCorrupt removes the corrupt mark from blocks [first, first+n).
func (e *extent) clearCorrupt(first, n uint32) {
	if e.corruptCount.Load() == 0 {
		return
	}
	e.corruptMu.Lock()
	defer e.corruptMu.Unlock()
	for b := first; b < first+n; b++ {
		delete(e.corrupt, b)
	}
	e.corruptCount.Store(int32(len(e.corrupt)))
}

// corruptList returns the extent's corrupt blocks, unordered.
func (e *extent) corruptList() []uint32 {
	if e.corruptCount.Load() == 0 {
		return nil
	}
	e.corruptMu.Lock()
	defer e.corruptMu.Unlock()
	out := make([]uint32, 0, len(e.corrupt))
	for b := range e.corrupt {
		out = append(out, b)
	}
	return out
}

// pwriteFull writes all of p at off, retrying short writes.
func pwriteFull(f File, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := f.WriteAt(p, off)
		if err != nil {
			return classify(err)
		}
		if n <= 0 {
			return io.ErrShortWrite
		}
		p = p[n:]
		off += int64(n)
	}
	return nil
}

// preadFull fills p from off, retrying short reads.
func preadFull(f File, p []byte, off int64) error {
	for len(p) > 0 {
		n, err := f.ReadAt(p, off)
		if n > 0 {
			p = p[n:]
			off += int64(n)
			continue
		}
		if err != nil {
			return err
		}
		return io.ErrUnexpectedEOF
	}
	return nil
}

// fdatasync makes f's data (and the metadata needed to read it) durable.
func fdatasync(f File) error { return classify(f.Datasync()) }
