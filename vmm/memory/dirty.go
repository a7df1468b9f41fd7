package memory

import (
	"fmt"
	"math/bits"
	"sync/atomic"
)

// DirtyBitmap records which pages of a region were written, one bit per
// PageSize page, in the layout of KVM's dirty log (bit i of word i/64 is
// page i). Marks and harvests are atomic per word, so devices may mark
// while migration harvests.
type DirtyBitmap struct {
	// Immutable after construction.
	pages uint64
	// words is accessed only with sync/atomic.
	words []uint64
}

// NewDirtyBitmap returns a clean bitmap for pages pages.
func NewDirtyBitmap(pages uint64) *DirtyBitmap {
	return &DirtyBitmap{pages: pages, words: make([]uint64, (pages+63)/64)}
}

// Pages returns how many pages the bitmap covers.
func (d *DirtyBitmap) Pages() uint64 { return d.pages }

// Mark records page as dirty; pages past the end are ignored.
func (d *DirtyBitmap) Mark(page uint64) {
	if page < d.pages {
		atomic.OrUint64(&d.words[page/64], 1<<(page%64))
	}
}

// MarkRange marks every page that [off, off+n) (byte offsets in the
// region) touches; the part past the region is ignored.
func (d *DirtyBitmap) MarkRange(off, n uint64) {
	if n == 0 {
		return
	}
	last := (off + n - 1) / PageSize
	if off+n-1 < off { // wrapped
		last = d.pages
	}
	for p := off / PageSize; p <= last && p < d.pages; p++ {
		d.Mark(p)
	}
}

// IsDirty reports whether page is marked.
func (d *DirtyBitmap) IsDirty(page uint64) bool {
	return page < d.pages && atomic.LoadUint64(&d.words[page/64])&(1<<(page%64)) != 0
}

// Count returns how many pages are marked.
func (d *DirtyBitmap) Count() uint64 {
	var n int
	for i := range d.words {
		n += bits.OnesCount64(atomic.LoadUint64(&d.words[i]))
	}
	return uint64(n)
}

// MergeKVM ORs in a bitmap in KVM_GET_DIRTY_LOG's layout, which must have
// exactly one word per 64 pages. Bits past Pages are ignored.
func (d *DirtyBitmap) MergeKVM(kvm []uint64) error {
	if len(kvm) != len(d.words) {
		return fmt.Errorf("merging dirty log: %d words for %d pages, want %d", len(kvm), d.pages, len(d.words))
	}
	for i, w := range kvm {
		if i == len(d.words)-1 && d.pages%64 != 0 {
			w &= 1<<(d.pages%64) - 1
		}
		if w != 0 {
			atomic.OrUint64(&d.words[i], w)
		}
	}
	return nil
}

// Take returns the marked pages as a bitmap in KVM's layout and clears
// them, word by word atomically: a page marked during Take is either in
// the result or still marked afterwards, never lost.
func (d *DirtyBitmap) Take() []uint64 {
	out := make([]uint64, len(d.words))
	for i := range d.words {
		out[i] = atomic.SwapUint64(&d.words[i], 0)
	}
	return out
}

// DirtyPages lists the pages set in a bitmap in KVM's layout.
func DirtyPages(bitmap []uint64) []uint64 {
	var pages []uint64
	for i, w := range bitmap {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			pages = append(pages, uint64(i)*64+uint64(b))
			w &= w - 1
		}
	}
	return pages
}
