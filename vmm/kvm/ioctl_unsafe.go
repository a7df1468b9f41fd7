package kvm

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctl issues request on fd with arg as its integer argument and returns
// the call's result.
func ioctl(fd int, request, arg uintptr) (uintptr, error) {
	r, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), request, arg)
	if errno != 0 {
		return r, errno
	}
	return r, nil
}

// ioctlPtr issues request on fd with a pointer to *p as its argument.
func ioctlPtr[T any](fd int, request uintptr, p *T) error {
	_, err := ioctl(fd, request, uintptr(unsafe.Pointer(p)))
	return err
}

// ioctlBytes issues request on fd with a pointer to the first byte of b.
func ioctlBytes(fd int, request uintptr, b []byte) error {
	_, err := ioctl(fd, request, uintptr(unsafe.Pointer(&b[0])))
	return err
}

// runHeaderSize is the bytes of kvm_run before its exit union.
const runHeaderSize = uint64(unsafe.Sizeof(runHeader{}))

// sliceAddr is the host virtual address of b's first byte.
func sliceAddr(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(&b[0]))) }

// view returns the T at byte offset off of b; b must be long enough and
// off suitably aligned (the kvm_run page is page-aligned).
func view[T any](b []byte, off uintptr) *T {
	var zero T
	if off+unsafe.Sizeof(zero) > uintptr(len(b)) {
		panic("kvm: view past the end of the mapping") // broken internal invariant
	}
	return (*T)(unsafe.Pointer(&b[off]))
}

// cpuidBuffer lays out a struct kvm_cpuid2 with room for n entries.
func cpuidBuffer(n int) []byte {
	return make([]byte, unsafe.Sizeof(cpuid2Header{})+uintptr(n)*unsafe.Sizeof(CPUIDEntry2{}))
}

// cpuidEntries returns the entries of a kvm_cpuid2 buffer (copied).
func cpuidEntries(b []byte) []CPUIDEntry2 {
	h := view[cpuid2Header](b, 0)
	max := (uintptr(len(b)) - unsafe.Sizeof(cpuid2Header{})) / unsafe.Sizeof(CPUIDEntry2{})
	n := min(uintptr(h.Nent), max)
	out := make([]CPUIDEntry2, n)
	for i := range out {
		out[i] = *view[CPUIDEntry2](b, unsafe.Sizeof(cpuid2Header{})+uintptr(i)*unsafe.Sizeof(CPUIDEntry2{}))
	}
	return out
}

// cpuidPack builds a kvm_cpuid2 buffer holding entries.
func cpuidPack(entries []CPUIDEntry2) []byte {
	b := cpuidBuffer(len(entries))
	view[cpuid2Header](b, 0).Nent = uint32(len(entries))
	for i, e := range entries {
		*view[CPUIDEntry2](b, unsafe.Sizeof(cpuid2Header{})+uintptr(i)*unsafe.Sizeof(CPUIDEntry2{})) = e
	}
	return b
}
