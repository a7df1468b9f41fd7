package kvm

import (
	"sync/atomic"
	"unsafe"
)

// This file holds the unsafe code of abi_state.go's ioctls: the layouts
// with flexible arrays (kvm_msrs, kvm_msr_list), the dirty-log arguments
// that carry a user pointer, and the atomic accesses to the dirty ring,
// which KVM and this process share.

// dirtyLogArg is struct kvm_dirty_log. Bitmap is an unsafe.Pointer, not a
// uint64, so the garbage collector keeps the bitmap alive and a stack move
// updates it.
type dirtyLogArg struct {
	Slot   uint32
	_      uint32
	Bitmap unsafe.Pointer
}

// clearDirtyLogArg is struct kvm_clear_dirty_log (Bitmap as in dirtyLogArg).
type clearDirtyLogArg struct {
	Slot      uint32
	NumPages  uint32
	FirstPage uint64
	Bitmap    unsafe.Pointer
}

// newDirtyLogArg points a kvm_dirty_log for slot at bitmap.
func newDirtyLogArg(slot uint32, bitmap []uint64) dirtyLogArg {
	return dirtyLogArg{Slot: slot, Bitmap: unsafe.Pointer(&bitmap[0])}
}

// newClearDirtyLogArg points a kvm_clear_dirty_log at bitmap.
func newClearDirtyLogArg(slot uint32, firstPage uint64, numPages uint32, bitmap []uint64) clearDirtyLogArg {
	return clearDirtyLogArg{Slot: slot, FirstPage: firstPage, NumPages: numPages, Bitmap: unsafe.Pointer(&bitmap[0])}
}

// msrsPack lays out a struct kvm_msrs holding entries.
func msrsPack(entries []MSREntry) []byte {
	hdr, size := unsafe.Sizeof(msrsHeader{}), unsafe.Sizeof(MSREntry{})
	b := make([]byte, hdr+uintptr(len(entries))*size)
	view[msrsHeader](b, 0).NMSRs = uint32(len(entries))
	for i, e := range entries {
		*view[MSREntry](b, hdr+uintptr(i)*size) = e
	}
	return b
}

// msrsUnpack returns the first n entries of a kvm_msrs buffer (copied).
func msrsUnpack(b []byte, n int) []MSREntry {
	hdr, size := unsafe.Sizeof(msrsHeader{}), unsafe.Sizeof(MSREntry{})
	n = min(n, int((uintptr(len(b))-hdr)/size))
	out := make([]MSREntry, n)
	for i := range out {
		out[i] = *view[MSREntry](b, hdr+uintptr(i)*size)
	}
	return out
}

// msrListBuffer lays out a struct kvm_msr_list with room for n indices.
func msrListBuffer(n int) []byte {
	b := make([]byte, unsafe.Sizeof(msrListHeader{})+uintptr(n)*4)
	view[msrListHeader](b, 0).NMSRs = uint32(n)
	return b
}

// msrListCount is the nmsrs field of a kvm_msr_list buffer.
func msrListCount(b []byte) int { return int(view[msrListHeader](b, 0).NMSRs) }

// msrListIndices returns the indices of a kvm_msr_list buffer (copied).
func msrListIndices(b []byte) []uint32 {
	hdr := unsafe.Sizeof(msrListHeader{})
	n := min(msrListCount(b), int((uintptr(len(b))-hdr)/4))
	out := make([]uint32, n)
	for i := range out {
		out[i] = *view[uint32](b, hdr+uintptr(i)*4)
	}
	return out
}

// dirtyGFNSize is the bytes of one ring entry.
const dirtyGFNSize = uint32(unsafe.Sizeof(dirtyGFN{}))

// ringEntry returns dirty-ring entry i of the mapped ring.
func ringEntry(ring []byte, i uint32) *dirtyGFN {
	return view[dirtyGFN](ring, uintptr(i)*unsafe.Sizeof(dirtyGFN{}))
}

// loadFlagsAcquire reads an entry's flags with (at least) acquire order,
// so the slot and offset read after it are the ones KVM published.
func loadFlagsAcquire(e *dirtyGFN) uint32 { return atomic.LoadUint32(&e.Flags) }

// storeFlagsRelease writes an entry's flags with (at least) release order,
// after this process is done reading the entry.
func storeFlagsRelease(e *dirtyGFN, flags uint32) { atomic.StoreUint32(&e.Flags, flags) }

// ioctlBytesResult is ioctlBytes that also returns the call's result (the
// count of MSRs KVM_GET_MSRS and KVM_SET_MSRS processed).
func ioctlBytesResult(fd int, request uintptr, b []byte) (uintptr, error) {
	return ioctl(fd, request, uintptr(unsafe.Pointer(&b[0])))
}
