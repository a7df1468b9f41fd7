package kvm

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// VM is one KVM virtual machine: its fd and the vCPUs created in it.
type VM struct {
	// Immutable after CreateVM.
	sys *System

	mu    sync.Mutex
	fd    int     // guarded by mu; -1 after Close
	vcpus []*VCPU // guarded by mu; closed by Close
}

// MemoryRegion is one guest-physical memory slot backed by host memory.
type MemoryRegion struct {
	// Slot is the slot number; setting a slot again replaces it.
	Slot uint32
	// Flags are KVM_MEM_* flags (0, or KVM_MEM_LOG_DIRTY_PAGES = 1, …).
	Flags uint32
	// GuestPhysAddr is the slot's first guest-physical address.
	GuestPhysAddr uint64
	// Memory backs the slot: a page-aligned mapping whose length is a
	// multiple of the page size. It must stay mapped while the slot exists.
	Memory []byte
}

// SetUserMemoryRegion maps r into the guest (KVM_SET_USER_MEMORY_REGION).
func (vm *VM) SetUserMemoryRegion(r MemoryRegion) error {
	if len(r.Memory) == 0 || len(r.Memory)%unix.Getpagesize() != 0 {
		return fmt.Errorf("setting memory slot %d: %d bytes is not a positive multiple of the page size", r.Slot, len(r.Memory))
	}
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	arg := userspaceMemoryRegion{
		Slot:          r.Slot,
		Flags:         r.Flags,
		GuestPhysAddr: r.GuestPhysAddr,
		MemorySize:    uint64(len(r.Memory)),
		UserspaceAddr: sliceAddr(r.Memory),
	}
	if err := ioctlPtr(fd, kvmSetUserMemoryRegion, &arg); err != nil {
		return fmt.Errorf("setting memory slot %d at %#x: %w", r.Slot, r.GuestPhysAddr, err)
	}
	return nil
}

func (vm *VM) rawFd() (int, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.fd < 0 {
		return -1, ErrClosed
	}
	return vm.fd, nil
}

// CreateVCPU creates vCPU id (KVM_CREATE_VCPU) and maps its kvm_run.
func (vm *VM) CreateVCPU(id int) (_ *VCPU, err error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.fd < 0 {
		return nil, ErrClosed
	}
	fd, err := ioctl(vm.fd, kvmCreateVCPU, uintptr(id))
	if err != nil {
		return nil, fmt.Errorf("creating vCPU %d: %w", id, err)
	}
	unix.CloseOnExec(int(fd))
	run, err := unix.Mmap(int(fd), 0, vm.sys.mmapSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(int(fd))
		return nil, fmt.Errorf("mapping kvm_run of vCPU %d: %w", id, err)
	}
	c := &VCPU{id: id, fd: int(fd), run: run}
	vm.vcpus = append(vm.vcpus, c)
	return c, nil
}

// Close closes every vCPU of the VM, then the VM fd. The caller must have
// stopped running the vCPUs. Closing twice is a no-op.
func (vm *VM) Close() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.fd < 0 {
		return nil
	}
	var errs []error
	for _, c := range vm.vcpus {
		errs = append(errs, c.Close())
	}
	vm.vcpus = nil
	if err := unix.Close(vm.fd); err != nil {
		errs = append(errs, fmt.Errorf("closing VM: %w", err))
	}
	vm.fd = -1
	return errors.Join(errs...)
}
