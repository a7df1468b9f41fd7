package memory

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// word32 returns a pointer to the aligned 32-bit word of the mapping that
// holds the naturally aligned size-byte value at gpa, and the value's bit
// shift inside it. The mapping is page-aligned, so an aligned guest address
// is an aligned host address.
func (m *Memory) word32(gpa GPA, size uint64) (*uint32, uint, error) {
	if uint64(gpa)%size != 0 {
		return nil, 0, fmt.Errorf("accessing %d bytes at %#x: %w", size, uint64(gpa), ErrMisaligned)
	}
	aligned := gpa &^ 3
	s, err := m.Slice(aligned, 4)
	if err != nil {
		return nil, 0, err
	}
	return (*uint32)(unsafe.Pointer(&s[0])), uint(gpa-aligned) * 8, nil
}

// AtomicUint16 loads the uint16 at gpa (2-aligned) atomically: the
// enclosing aligned 32-bit word is loaded with sync/atomic. x86 is
// little-endian, as is virtio.
func (m *Memory) AtomicUint16(gpa GPA) (uint16, error) {
	p, shift, err := m.word32(gpa, 2)
	if err != nil {
		return 0, err
	}
	return uint16(atomic.LoadUint32(p) >> shift), nil
}

// AtomicPutUint16 stores v at gpa (2-aligned) atomically, by
// compare-and-swap on the enclosing 32-bit word so that the other half,
// which the guest may own, is never overwritten; it marks the page dirty.
func (m *Memory) AtomicPutUint16(gpa GPA, v uint16) error {
	p, shift, err := m.word32(gpa, 2)
	if err != nil {
		return err
	}
	mask := uint32(0xffff) << shift
	for {
		old := atomic.LoadUint32(p)
		if atomic.CompareAndSwapUint32(p, old, old&^mask|uint32(v)<<shift) {
			break
		}
	}
	return m.MarkDirty(gpa, 2)
}

// AtomicUint32 loads the uint32 at gpa (4-aligned) atomically.
func (m *Memory) AtomicUint32(gpa GPA) (uint32, error) {
	p, _, err := m.word32(gpa, 4)
	if err != nil {
		return 0, err
	}
	return atomic.LoadUint32(p), nil
}

// AtomicPutUint32 stores v at gpa (4-aligned) atomically and marks the page
// dirty.
func (m *Memory) AtomicPutUint32(gpa GPA, v uint32) error {
	p, _, err := m.word32(gpa, 4)
	if err != nil {
		return err
	}
	atomic.StoreUint32(p, v)
	return m.MarkDirty(gpa, 4)
}
