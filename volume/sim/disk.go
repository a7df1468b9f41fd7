package sim

import (
	"fmt"
	"io"
	"io/fs"
	"slices"
	"sync"

	"tern/volume/extent"
)

// disk is a simulated file system for one downstairs' region (an
// extent.FS). Each file has durable content (what survived the last sync)
// and a list of writes made since; reads see both. A crash keeps the
// durable content and a random prefix of the later writes, tearing the
// last one it keeps at a random byte: exactly what a power cut may leave
// of a file whose unsynced writes reach the platter in order. Files
// replaced with WriteFileAtomic are durable at once.
//
// The region calls it from a few goroutines at a time (parallel flushes
// and extent loads), each on its own files, so a mutex is enough and the
// outcome does not depend on their interleaving.
type disk struct {
	mu    sync.Mutex
	files map[string]*diskFile
}

type diskFile struct {
	durable []byte
	current []byte // durable with pending applied
	pending []pendingWrite
}

type pendingWrite struct {
	off  int64
	data []byte
}

func newDisk() *disk { return &disk{files: make(map[string]*diskFile)} }

// names returns the files in order, so a crash is deterministic.
func (d *disk) names() []string {
	out := make([]string, 0, len(d.files))
	for n := range d.files {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// crash loses what was not synced, drawing from pick (which returns a
// number in [0, n)) how much of each file's pending writes survives. It
// reports how many files lost or tore writes.
func (d *disk) crash(pick func(n int) int, tear bool) (lost, torn int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, name := range d.names() {
		f := d.files[name]
		if len(f.pending) == 0 {
			continue
		}
		keep := pick(len(f.pending) + 1) // whole writes that reached disk
		img := slices.Clone(f.durable)
		for _, w := range f.pending[:keep] {
			copy(img[w.off:], w.data)
		}
		if keep < len(f.pending) {
			lost++
			if w := f.pending[keep]; tear && len(w.data) > 1 && pick(2) == 0 {
				n := 1 + pick(len(w.data)-1) // a torn write: a prefix landed
				copy(img[w.off:], w.data[:n])
				torn++
			}
		}
		f.durable, f.current, f.pending = img, slices.Clone(img), nil
	}
	return lost, torn
}

// flipBit flips one bit of name's content at byte off, durably (as media
// decay would).
func (d *disk) flipBit(name string, off int64, bit uint) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, ok := d.files[name]
	if !ok || off >= int64(len(f.current)) {
		return false
	}
	f.current[off] ^= 1 << bit
	f.durable[off] ^= 1 << bit
	for _, w := range f.pending {
		if off >= w.off && off < w.off+int64(len(w.data)) {
			w.data[off-w.off] ^= 1 << bit
		}
	}
	return true
}

func (d *disk) OpenFile(name string, readOnly bool) (extent.File, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.files[name]; !ok {
		return nil, fmt.Errorf("open %s: %w", name, fs.ErrNotExist)
	}
	return &diskHandle{d: d, name: name, readOnly: readOnly}, nil
}

func (d *disk) CreateFile(name string, size int64) (extent.File, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// A new file's existence and size are durable at the next SyncAll;
	// the simulation creates regions before any crash can happen.
	d.files[name] = &diskFile{durable: make([]byte, size), current: make([]byte, size)}
	return &diskHandle{d: d, name: name}, nil
}

func (d *disk) ReadFile(name string) ([]byte, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	f, ok := d.files[name]
	if !ok {
		return nil, fmt.Errorf("read %s: %w", name, fs.ErrNotExist)
	}
	return slices.Clone(f.current), nil
}

func (d *disk) WriteFileAtomic(name string, data []byte) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.files[name] = &diskFile{durable: slices.Clone(data), current: slices.Clone(data)}
	return nil
}

func (d *disk) Remove(name string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.files[name]; !ok {
		return fmt.Errorf("remove %s: %w", name, fs.ErrNotExist)
	}
	delete(d.files, name)
	return nil
}

func (d *disk) SyncAll() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, f := range d.files {
		f.sync()
	}
	return nil
}

func (f *diskFile) sync() {
	f.durable = slices.Clone(f.current)
	f.pending = nil
}

// diskHandle is an open file of a disk.
type diskHandle struct {
	d        *disk
	name     string
	readOnly bool
}

func (h *diskHandle) file() (*diskFile, error) {
	f, ok := h.d.files[h.name]
	if !ok {
		return nil, fmt.Errorf("%s: %w", h.name, fs.ErrNotExist)
	}
	return f, nil
}

func (h *diskHandle) ReadAt(p []byte, off int64) (int, error) {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	f, err := h.file()
	if err != nil {
		return 0, err
	}
	if off >= int64(len(f.current)) {
		return 0, io.EOF
	}
	n := copy(p, f.current[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

func (h *diskHandle) WriteAt(p []byte, off int64) (int, error) {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	if h.readOnly {
		return 0, fmt.Errorf("write %s: %w", h.name, fs.ErrPermission)
	}
	f, err := h.file()
	if err != nil {
		return 0, err
	}
	if end := off + int64(len(p)); end > int64(len(f.current)) {
		return 0, fmt.Errorf("write %s past its end: %w", h.name, io.ErrShortWrite)
	}
	copy(f.current[off:], p)
	f.pending = append(f.pending, pendingWrite{off: off, data: slices.Clone(p)})
	return len(p), nil
}

func (h *diskHandle) Datasync() error {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	f, err := h.file()
	if err != nil {
		return err
	}
	f.sync()
	return nil
}

func (h *diskHandle) Size() (int64, error) {
	h.d.mu.Lock()
	defer h.d.mu.Unlock()
	f, err := h.file()
	if err != nil {
		return 0, err
	}
	return int64(len(f.current)), nil
}

func (h *diskHandle) Close() error { return nil }
