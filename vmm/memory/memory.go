package memory

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
)

// ErrOutOfRange reports an access that is not wholly inside one region.
var ErrOutOfRange = errors.New("guest memory access out of range")

// ErrMisaligned reports an atomic access at an address that is not
// naturally aligned for its size.
var ErrMisaligned = errors.New("misaligned guest memory access")

// ErrClosed reports an access to a Memory after Close.
var ErrClosed = errors.New("guest memory closed")

// Memory is a guest's RAM: a set of non-overlapping regions. Accessors are
// safe for concurrent use; Close must not race with them (the VM closes
// memory only after its vCPUs and devices have stopped).
type Memory struct {
	// Immutable after construction until Close.
	regions []*Region // sorted by base
}

// New creates, sizes and maps one memfd per spec. It validates every spec
// first and reports all the problems at once.
func New(specs ...RegionSpec) (_ *Memory, err error) {
	if err := validateSpecs(specs); err != nil {
		return nil, err
	}
	m := &Memory{}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	for _, s := range specs {
		r, err := openRegion(s)
		if err != nil {
			return nil, err
		}
		m.regions = append(m.regions, r)
	}
	sort.Slice(m.regions, func(i, j int) bool { return m.regions[i].spec.Base < m.regions[j].spec.Base })
	return m, nil
}

// Close unmaps every region and closes its memfd. Slices obtained before
// must not be used after.
func (m *Memory) Close() error {
	var errs []error
	for _, r := range m.regions {
		errs = append(errs, r.close())
	}
	m.regions = nil
	return errors.Join(errs...)
}

// Regions returns the regions sorted by base address.
func (m *Memory) Regions() []*Region { return append([]*Region(nil), m.regions...) }

// Size returns the total bytes of RAM across regions.
func (m *Memory) Size() uint64 {
	var n uint64
	for _, r := range m.regions {
		n += r.spec.Size
	}
	return n
}

// region returns the region holding all of [gpa, gpa+n).
func (m *Memory) region(gpa GPA, n uint64) (*Region, error) {
	if m.regions == nil {
		return nil, ErrClosed
	}
	i := sort.Search(len(m.regions), func(i int) bool { return m.regions[i].spec.Base > gpa }) - 1
	if i >= 0 && m.regions[i].contains(gpa, n) {
		return m.regions[i], nil
	}
	return nil, fmt.Errorf("accessing [%#x, +%d): %w", uint64(gpa), n, ErrOutOfRange)
}

// Contains reports whether [gpa, gpa+n) lies wholly inside one region.
func (m *Memory) Contains(gpa GPA, n uint64) bool {
	_, err := m.region(gpa, n)
	return err == nil
}

// Slice returns the n bytes at gpa as a slice of the mapping (no copy),
// capped at n. The range must lie inside one region.
func (m *Memory) Slice(gpa GPA, n uint64) ([]byte, error) {
	r, err := m.region(gpa, n)
	if err != nil {
		return nil, err
	}
	off := uint64(gpa - r.spec.Base)
	return r.mem[off : off+n : off+n], nil
}

// MarkDirty records that the VMM itself wrote [gpa, gpa+n), which KVM's
// dirty log cannot see. Call it after the write has landed.
func (m *Memory) MarkDirty(gpa GPA, n uint64) error {
	r, err := m.region(gpa, n)
	if err != nil {
		return err
	}
	r.dirty.MarkRange(uint64(gpa-r.spec.Base), n)
	return nil
}

// Read copies len(p) bytes at gpa into p.
func (m *Memory) Read(gpa GPA, p []byte) error {
	s, err := m.Slice(gpa, uint64(len(p)))
	if err != nil {
		return err
	}
	copy(p, s)
	return nil
}

// Write copies p to gpa and marks the pages dirty.
func (m *Memory) Write(gpa GPA, p []byte) error {
	s, err := m.Slice(gpa, uint64(len(p)))
	if err != nil {
		return err
	}
	copy(s, p)
	return m.MarkDirty(gpa, uint64(len(p)))
}

// Uint8 reads the byte at gpa.
func (m *Memory) Uint8(gpa GPA) (uint8, error) {
	s, err := m.Slice(gpa, 1)
	if err != nil {
		return 0, err
	}
	return s[0], nil
}

// Uint16 reads the little-endian uint16 at gpa (not atomically).
func (m *Memory) Uint16(gpa GPA) (uint16, error) {
	s, err := m.Slice(gpa, 2)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(s), nil
}

// Uint32 reads the little-endian uint32 at gpa (not atomically).
func (m *Memory) Uint32(gpa GPA) (uint32, error) {
	s, err := m.Slice(gpa, 4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(s), nil
}

// Uint64 reads the little-endian uint64 at gpa (not atomically).
func (m *Memory) Uint64(gpa GPA) (uint64, error) {
	s, err := m.Slice(gpa, 8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(s), nil
}

// PutUint8 writes v at gpa and marks the page dirty.
func (m *Memory) PutUint8(gpa GPA, v uint8) error { return m.Write(gpa, []byte{v}) }

// PutUint16 writes v little-endian at gpa and marks the page dirty.
func (m *Memory) PutUint16(gpa GPA, v uint16) error {
	return m.Write(gpa, binary.LittleEndian.AppendUint16(nil, v))
}

// PutUint32 writes v little-endian at gpa and marks the page dirty.
func (m *Memory) PutUint32(gpa GPA, v uint32) error {
	return m.Write(gpa, binary.LittleEndian.AppendUint32(nil, v))
}

// PutUint64 writes v little-endian at gpa and marks the page dirty.
func (m *Memory) PutUint64(gpa GPA, v uint64) error {
	return m.Write(gpa, binary.LittleEndian.AppendUint64(nil, v))
}
