package kvm

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// DevicePath is the KVM device node.
const DevicePath = "/dev/kvm"

// ErrNotSupported reports that this host's KVM lacks something tern needs
// (an API version, a capability). Test with errors.Is.
var ErrNotSupported = errors.New("not supported by this host's KVM")

// ErrClosed reports a call on a System, VM or VCPU after Close.
var ErrClosed = errors.New("kvm object closed")

// System is an open /dev/kvm: the system-wide KVM fd.
type System struct {
	// Immutable after Open.
	mmapSize int

	mu sync.Mutex
	fd int // guarded by mu; -1 after Close
}

// Open opens /dev/kvm and checks its API version (ErrNotSupported when it
// is not APIVersion).
func Open() (_ *System, err error) {
	fd, err := unix.Open(DevicePath, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening KVM: %w", &os.PathError{Op: "open", Path: DevicePath, Err: err})
	}
	s := &System{fd: fd}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	v, err := ioctl(fd, kvmGetAPIVersion, 0)
	if err != nil {
		return nil, fmt.Errorf("getting KVM API version: %w", err)
	}
	if v != APIVersion {
		return nil, fmt.Errorf("checking KVM API version: got %d, want %d: %w", v, APIVersion, ErrNotSupported)
	}
	size, err := ioctl(fd, kvmGetVCPUMmapSize, 0)
	if err != nil {
		return nil, fmt.Errorf("getting vCPU mmap size: %w", err)
	}
	s.mmapSize = int(size)
	return s, nil
}

// rawFd returns the fd or ErrClosed.
func (s *System) rawFd() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return -1, ErrClosed
	}
	return s.fd, nil
}

// VCPUMmapSize is the size of each vCPU's kvm_run mapping
// (KVM_GET_VCPU_MMAP_SIZE).
func (s *System) VCPUMmapSize() int { return s.mmapSize }

// CheckExtension returns KVM_CHECK_EXTENSION's answer for c: 0 when absent,
// otherwise 1 or a capability-specific value.
func (s *System) CheckExtension(c Capability) (int, error) {
	fd, err := s.rawFd()
	if err != nil {
		return 0, err
	}
	r, err := ioctl(fd, kvmCheckExtension, uintptr(c))
	if err != nil {
		return 0, fmt.Errorf("checking KVM capability %d: %w", c, err)
	}
	return int(r), nil
}

// RequireExtension returns ErrNotSupported when c is absent.
func (s *System) RequireExtension(c Capability) error {
	v, err := s.CheckExtension(c)
	if err != nil {
		return err
	}
	if v == 0 {
		return fmt.Errorf("checking KVM capability %d: %w", c, ErrNotSupported)
	}
	return nil
}

// SupportedCPUID returns the CPUID leaves KVM can offer a guest
// (KVM_GET_SUPPORTED_CPUID), growing the buffer until they fit.
func (s *System) SupportedCPUID() ([]CPUIDEntry2, error) {
	fd, err := s.rawFd()
	if err != nil {
		return nil, err
	}
	for n := 64; n <= 4096; n *= 2 {
		b := cpuidBuffer(n)
		view[cpuid2Header](b, 0).Nent = uint32(n)
		err := ioctlBytes(fd, kvmGetSupportedCPUID, b)
		if errors.Is(err, unix.E2BIG) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("getting supported CPUID: %w", err)
		}
		return cpuidEntries(b), nil
	}
	return nil, fmt.Errorf("getting supported CPUID: more than 4096 entries: %w", ErrNotSupported)
}

// CreateVM creates a VM (KVM_CREATE_VM, default machine type).
func (s *System) CreateVM() (*VM, error) {
	fd, err := s.rawFd()
	if err != nil {
		return nil, err
	}
	var vmfd uintptr
	for {
		vmfd, err = ioctl(fd, kvmCreateVM, 0)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("creating VM: %w", err)
	}
	unix.CloseOnExec(int(vmfd))
	return &VM{sys: s, fd: int(vmfd)}, nil
}

// Close closes /dev/kvm. VMs created from it stay usable until their own
// Close. Closing twice is a no-op.
func (s *System) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	if err != nil {
		return fmt.Errorf("closing %s: %w", DevicePath, err)
	}
	return nil
}
