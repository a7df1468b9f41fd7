package kvm

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// CapabilityError reports that this host's KVM lacks capability Cap, which
// Op needs. It matches ErrNotSupported with errors.Is, so callers and tests
// can skip cleanly.
type CapabilityError struct {
	// Op is what was being done, e.g. "enabling the dirty ring".
	Op string
	// Cap is the capability KVM_CHECK_EXTENSION denied.
	Cap Capability
}

// Error says what failed and which capability is missing.
func (e *CapabilityError) Error() string {
	return fmt.Sprintf("%s: %v: %v", e.Op, e.Cap, ErrNotSupported)
}

// Unwrap returns ErrNotSupported.
func (e *CapabilityError) Unwrap() error { return ErrNotSupported }

// capNames is an array, not a map: a constant table the linker lays
// out, with no work when the process starts.
var capNames = [...]string{
	CapIRQChip: "IRQCHIP", CapUserMemory: "USER_MEMORY", CapExtCPUID: "EXT_CPUID",
	CapNrVCPUs: "NR_VCPUS", CapMPState: "MP_STATE", CapIRQFD: "IRQFD", CapPIT2: "PIT2",
	CapIOEventFD: "IOEVENTFD", CapAdjustClock: "ADJUST_CLOCK", CapVCPUEvents: "VCPU_EVENTS",
	CapEnableCap: "ENABLE_CAP", CapXSAVE: "XSAVE", CapXCRs: "XCRS", CapDebugRegs: "DEBUGREGS",
	CapTSCControl: "TSC_CONTROL", CapGetTSCKHz: "GET_TSC_KHZ", CapTSCDeadlineTimer: "TSC_DEADLINE_TIMER", CapMaxVCPUs: "MAX_VCPUS",
	CapEnableCapVM: "ENABLE_CAP_VM", CapImmediateExit: "IMMEDIATE_EXIT",
	CapManualDirtyLogProtect2: "MANUAL_DIRTY_LOG_PROTECT2", CapDirtyLogRing: "DIRTY_LOG_RING",
	CapXSAVE2: "XSAVE2", CapDirtyLogRingAcqRel: "DIRTY_LOG_RING_ACQ_REL",
	CapDirtyLogRingWithBitmap: "DIRTY_LOG_RING_WITH_BITMAP",
}

// String names the capability as linux/kvm.h does (KVM_CAP_…).
func (c Capability) String() string {
	if int(c) < len(capNames) && capNames[c] != "" {
		return "KVM_CAP_" + capNames[c]
	}
	return "KVM_CAP_" + itoa(uint64(c))
}

// CheckExtension returns KVM_CHECK_EXTENSION's answer for c on the VM fd,
// which can differ from the system's (KVM_CAP_XSAVE2's size, the dirty
// ring's limit, capabilities of the VM's type): 0 when absent.
func (vm *VM) CheckExtension(c Capability) (int, error) {
	fd, err := vm.rawFd()
	if err != nil {
		return 0, err
	}
	r, err := ioctl(fd, kvmCheckExtension, uintptr(c))
	if err != nil {
		return 0, fmt.Errorf("checking %v on VM: %w", c, err)
	}
	return int(r), nil
}

// requireVM returns the VM's answer for c, or a *CapabilityError for op
// when it is 0.
func (vm *VM) requireVM(op string, c Capability) (int, error) {
	v, err := vm.CheckExtension(c)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if v == 0 {
		return 0, &CapabilityError{Op: op, Cap: c}
	}
	return v, nil
}

// EnableCap enables capability c on the VM with up to four arguments
// (KVM_ENABLE_CAP on the VM fd). A capability KVM_CHECK_EXTENSION denies
// is a *CapabilityError; an argument KVM rejects is EINVAL.
func (vm *VM) EnableCap(c Capability, args ...uint64) error {
	op := fmt.Sprintf("enabling %v on VM", c)
	if len(args) > 4 {
		return fmt.Errorf("%s: %d arguments, at most 4", op, len(args))
	}
	if _, err := vm.requireVM(op, CapEnableCapVM); err != nil {
		return err
	}
	if _, err := vm.requireVM(op, c); err != nil {
		return err
	}
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	arg := enableCapArg{Cap: uint32(c)}
	copy(arg.Args[:], args)
	if err := ioctlPtr(fd, kvmEnableCap, &arg); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// EnableCap enables capability c on the vCPU (KVM_ENABLE_CAP on the vCPU
// fd), for the few capabilities that are per vCPU (Hyper-V SynIC, …).
// KVM answers EINVAL for one it does not know per vCPU, which is reported
// as ErrNotSupported: a vCPU has no KVM_CHECK_EXTENSION to ask first.
func (c *VCPU) EnableCap(cp Capability, args ...uint64) error {
	op := fmt.Sprintf("enabling %v on vCPU %d", cp, c.id)
	if len(args) > 4 {
		return fmt.Errorf("%s: %d arguments, at most 4", op, len(args))
	}
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	arg := enableCapArg{Cap: uint32(cp)}
	copy(arg.Args[:], args)
	err = ioctlPtr(fd, kvmEnableCap, &arg)
	if errors.Is(err, unix.EINVAL) {
		return &CapabilityError{Op: op, Cap: cp}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// capNone stands for "no capability": an ioctl every x86 KVM has.
const capNone Capability = 1<<32 - 1

// opError wraps err of op, turning ENOTTY (the kernel does not know the
// ioctl) into a *CapabilityError for c: a vCPU has no KVM_CHECK_EXTENSION
// to ask first.
func opError(op string, err error, c Capability) error {
	if c != capNone && errors.Is(err, unix.ENOTTY) {
		return &CapabilityError{Op: op, Cap: c}
	}
	return fmt.Errorf("%s: %w", op, err)
}
