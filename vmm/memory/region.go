package memory

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// GPA is a guest-physical address.
type GPA uint64

// PageSize is the granularity of regions and dirty tracking (KVM's dirty
// log is per 4 KiB page on x86).
const PageSize = 4096

// HugePageSize is the size of the huge pages a HugeTLB region uses.
const HugePageSize = 2 << 20

// RegionSpec describes one region of guest RAM before it exists.
type RegionSpec struct {
	// Name identifies the region in errors and names its memfd.
	Name string
	// Base is the region's first guest-physical address (page-aligned).
	Base GPA
	// Size is the region's length in bytes (a positive multiple of
	// PageSize, or of HugePageSize with HugeTLB).
	Size uint64
	// HugeTLB backs the region with 2 MiB huge pages (MFD_HUGETLB); the
	// host must have them reserved.
	HugeTLB bool
}

// end returns the first address past the spec and whether it overflowed.
func (s RegionSpec) end() (GPA, bool) {
	e := s.Base + GPA(s.Size)
	return e, e < s.Base
}

// String names the spec and its range for error messages.
func (s RegionSpec) String() string {
	e, _ := s.end()
	return fmt.Sprintf("region %q [%#x, %#x)", s.Name, uint64(s.Base), uint64(e))
}

// ErrInvalidSpec is wrapped by every error New reports about the specs.
var ErrInvalidSpec = errors.New("invalid memory region spec")

// validateSpecs returns every problem with the specs at once.
func validateSpecs(specs []RegionSpec) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, args...)...))
	}
	if len(specs) == 0 {
		bad("no regions")
	}
	names := map[string]bool{}
	for _, s := range specs {
		align := uint64(PageSize)
		if s.HugeTLB {
			align = HugePageSize
		}
		switch {
		case s.Name == "":
			bad("%v: empty name", s)
		case names[s.Name]:
			bad("%v: duplicate name", s)
		}
		names[s.Name] = true
		if s.Size == 0 {
			bad("%v: zero size", s)
		} else if s.Size%align != 0 {
			bad("%v: size %d is not a multiple of %d", s, s.Size, align)
		}
		if uint64(s.Base)%align != 0 {
			bad("%v: base is not %d-aligned", s, align)
		}
		if _, overflow := s.end(); overflow {
			bad("%v: range wraps past the end of the address space", s)
		}
	}
	for i := range specs {
		for j := i + 1; j < len(specs); j++ {
			a, b := specs[i], specs[j]
			ae, _ := a.end()
			be, _ := b.end()
			if a.Size != 0 && b.Size != 0 && a.Base < be && b.Base < ae {
				bad("%v overlaps %v", a, b)
			}
		}
	}
	return errors.Join(errs...)
}

// Region is one memfd-backed range of guest RAM mapped into tern.
type Region struct {
	// Immutable after construction.
	spec  RegionSpec
	fd    int
	mem   []byte
	dirty *DirtyBitmap
}

// openRegion creates, sizes and maps the memfd of a validated spec.
func openRegion(s RegionSpec) (r *Region, err error) {
	flags := unix.MFD_CLOEXEC
	if s.HugeTLB {
		flags |= unix.MFD_HUGETLB | unix.MFD_HUGE_2MB
	}
	fd, err := unix.MemfdCreate("tern-ram-"+s.Name, flags)
	if err != nil {
		return nil, fmt.Errorf("creating memfd for %v: %w", s, err)
	}
	defer func() {
		if err != nil {
			unix.Close(fd)
		}
	}()
	if err := unix.Ftruncate(fd, int64(s.Size)); err != nil {
		return nil, fmt.Errorf("sizing memfd for %v: %w", s, err)
	}
	mem, err := unix.Mmap(fd, 0, int(s.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping %v: %w", s, err)
	}
	return &Region{spec: s, fd: fd, mem: mem, dirty: NewDirtyBitmap(s.Size / PageSize)}, nil
}

// Name returns the region's name.
func (r *Region) Name() string { return r.spec.Name }

// Base returns the region's first guest-physical address.
func (r *Region) Base() GPA { return r.spec.Base }

// Size returns the region's length in bytes.
func (r *Region) Size() uint64 { return r.spec.Size }

// Spec returns the spec the region was built from.
func (r *Region) Spec() RegionSpec { return r.spec }

// Fd returns the region's memfd (owned by the region; valid until Close),
// for registering it with KVM or passing it to another process.
func (r *Region) Fd() int { return r.fd }

// Bytes returns the whole mapping (valid until Close).
func (r *Region) Bytes() []byte { return r.mem[:len(r.mem):len(r.mem)] }

// Dirty returns the region's dirty-page bitmap.
func (r *Region) Dirty() *DirtyBitmap { return r.dirty }

// contains reports whether [gpa, gpa+n) lies inside the region.
func (r *Region) contains(gpa GPA, n uint64) bool {
	if gpa < r.spec.Base {
		return false
	}
	off := uint64(gpa - r.spec.Base)
	return off <= r.spec.Size && n <= r.spec.Size-off
}

// close unmaps the region and closes its memfd.
func (r *Region) close() error {
	var errs []error
	if r.mem != nil {
		if err := unix.Munmap(r.mem); err != nil {
			errs = append(errs, fmt.Errorf("unmapping region %q: %w", r.spec.Name, err))
		}
		r.mem = nil
	}
	if r.fd >= 0 {
		if err := unix.Close(r.fd); err != nil {
			errs = append(errs, fmt.Errorf("closing memfd of region %q: %w", r.spec.Name, err))
		}
		r.fd = -1
	}
	return errors.Join(errs...)
}
