package kvm

import (
	"fmt"
	"math/bits"

	"golang.org/x/sys/unix"
)

// Dirty logging by ring. Instead of a bitmap per slot, KVM appends the
// page of each logged guest write to a ring per vCPU, mapped into this
// process. A harvester reads entries in order while the vCPU runs: an
// entry whose flags say dirty holds a page; the harvester then marks it
// for reset, and ResetDirtyRings hands every marked entry back to KVM and
// write-protects those pages again. When a ring is full the vCPU exits
// with ExitDirtyRingFull. The ring must be enabled before any vCPU exists,
// and a VM with a ring has no bitmap dirty log.

// DirtyRingSpec is how a VM's dirty rings were set up; MapDirtyRing needs
// it for each vCPU.
type DirtyRingSpec struct {
	// Entries is the number of entries of each vCPU's ring.
	Entries uint32
	// AcqRel reports KVM_CAP_DIRTY_LOG_RING_ACQ_REL: KVM publishes entries
	// with release and reads resets with acquire order.
	AcqRel bool
}

// EnableDirtyRing gives every vCPU created later a dirty ring of entries
// entries (a power of two), using KVM_CAP_DIRTY_LOG_RING_ACQ_REL where
// offered, else KVM_CAP_DIRTY_LOG_RING. Call it before CreateVCPU.
func (vm *VM) EnableDirtyRing(entries uint32) (DirtyRingSpec, error) {
	const op = "enabling the dirty ring"
	if entries == 0 || bits.OnesCount32(entries) != 1 || entries > 1<<26 {
		return DirtyRingSpec{}, fmt.Errorf("%s: %d entries is not a power of two", op, entries)
	}
	spec := DirtyRingSpec{Entries: entries, AcqRel: true}
	cp := CapDirtyLogRingAcqRel
	maxBytes, err := vm.CheckExtension(cp)
	if err != nil {
		return DirtyRingSpec{}, fmt.Errorf("%s: %w", op, err)
	}
	if maxBytes == 0 {
		spec.AcqRel, cp = false, CapDirtyLogRing
		if maxBytes, err = vm.requireVM(op, cp); err != nil {
			return DirtyRingSpec{}, err
		}
	}
	size := uint64(entries) * uint64(dirtyGFNSize)
	if size > uint64(maxBytes) {
		return DirtyRingSpec{}, fmt.Errorf("%s: %d bytes, the host allows at most %d", op, size, maxBytes)
	}
	if err := vm.EnableCap(cp, size); err != nil {
		return DirtyRingSpec{}, fmt.Errorf("%s: %w", op, err)
	}
	return spec, nil
}

// ResetDirtyRings hands the entries every harvester has marked back to
// KVM and write-protects their pages again (KVM_RESET_DIRTY_RINGS). It
// returns the number of entries reset.
func (vm *VM) ResetDirtyRings() (int, error) {
	fd, err := vm.rawFd()
	if err != nil {
		return 0, err
	}
	n, err := ioctl(fd, kvmResetDirtyRings, 0)
	if err != nil {
		return 0, fmt.Errorf("resetting dirty rings: %w", err)
	}
	return int(n), nil
}

// DirtyRing is one vCPU's mapped dirty ring. It is used by one harvester
// goroutine, which may run while the vCPU does.
type DirtyRing struct {
	// Immutable after MapDirtyRing.
	vcpu    int
	entries uint32

	// Owned by the harvester.
	ring []byte // the mapping; nil after Close
	next uint32 // free-running index of the next entry to read
}

// DirtyPage is one harvested ring entry.
type DirtyPage struct {
	// AddressSpace is the slot's address space (0 outside SMM).
	AddressSpace uint16
	// Slot is the memory slot number.
	Slot uint16
	// Page is the page index inside the slot.
	Page uint64
}

// MapDirtyRing maps the vCPU's dirty ring, at page KVM_DIRTY_LOG_PAGE_OFFSET
// of the vCPU fd, of the VM's spec. Close unmaps it.
func (c *VCPU) MapDirtyRing(spec DirtyRingSpec) (*DirtyRing, error) {
	if spec.Entries == 0 {
		return nil, fmt.Errorf("mapping dirty ring of vCPU %d: the VM has no dirty ring", c.id)
	}
	fd, err := c.rawFd()
	if err != nil {
		return nil, err
	}
	size := int(spec.Entries * dirtyGFNSize)
	ring, err := unix.Mmap(fd, int64(dirtyLogPageOffset*unix.Getpagesize()), size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mapping dirty ring of vCPU %d: %w", c.id, err)
	}
	return &DirtyRing{vcpu: c.id, entries: spec.Entries, ring: ring}, nil
}

// Harvest calls fn for each entry KVM has published since the last
// Harvest, in order, and marks each for reset. It returns how many it
// harvested; call VM.ResetDirtyRings afterwards to recycle them.
func (r *DirtyRing) Harvest(fn func(DirtyPage)) int {
	if r.ring == nil {
		panic("kvm: dirty ring harvested after Close") // broken invariant of the owner
	}
	n := 0
	for ; n < int(r.entries); n++ {
		e := ringEntry(r.ring, r.next&(r.entries-1))
		if loadFlagsAcquire(e)&dirtyGFNFlagDirty == 0 {
			break
		}
		fn(DirtyPage{AddressSpace: uint16(e.Slot >> 16), Slot: uint16(e.Slot), Page: e.Offset})
		storeFlagsRelease(e, dirtyGFNFlagReset)
		r.next++
	}
	return n
}

// Close unmaps the ring. Closing twice is a no-op.
func (r *DirtyRing) Close() error {
	if r.ring == nil {
		return nil
	}
	err := unix.Munmap(r.ring)
	r.ring = nil
	if err != nil {
		return fmt.Errorf("unmapping dirty ring of vCPU %d: %w", r.vcpu, err)
	}
	return nil
}
