package kvm

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"
)

// The vCPU's architectural state beyond Regs and Sregs: each piece has a
// getter and a setter over one KVM ioctl pair. VCPUState (vcpu_state.go)
// captures and restores them all in the order KVM needs.

// ErrNoIRQChip reports a LAPIC access on a VM without the in-kernel
// irqchip (CreateIRQChip), where the local APIC is user space's.
var ErrNoIRQChip = errors.New("no in-kernel irqchip")

// FPU reads the x87 and SSE state (KVM_GET_FPU).
func (c *VCPU) FPU() (FPU, error) {
	var f FPU
	err := vcpuIoctl(c, "getting FPU", kvmGetFPU, &f, capNone)
	return f, err
}

// SetFPU writes the x87 and SSE state (KVM_SET_FPU).
func (c *VCPU) SetFPU(f FPU) error {
	return vcpuIoctl(c, "setting FPU", kvmSetFPU, &f, capNone)
}

// XSAVESize is the bytes of a vCPU's XSAVE area in this VM: KVM_CAP_XSAVE2's
// answer where offered (at least 4096; more with dynamic features such as
// AMX), else 4096 with KVM_CAP_XSAVE.
func (vm *VM) XSAVESize() (int, error) {
	const op = "sizing XSAVE area"
	n, err := vm.CheckExtension(CapXSAVE2)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", op, err)
	}
	if n >= xsaveLegacySize {
		return n, nil
	}
	if _, err := vm.requireVM(op, CapXSAVE); err != nil {
		return 0, err
	}
	return xsaveLegacySize, nil
}

// XSAVE reads the vCPU's XSAVE area, size bytes from VM.XSAVESize: with
// KVM_GET_XSAVE2 when size is more than 4096, else KVM_GET_XSAVE.
func (c *VCPU) XSAVE(size int) ([]byte, error) {
	if size < xsaveLegacySize || size%4 != 0 {
		return nil, fmt.Errorf("getting XSAVE of vCPU %d: %d bytes, want a multiple of 4 from %d", c.id, size, xsaveLegacySize)
	}
	fd, err := c.rawFd()
	if err != nil {
		return nil, err
	}
	b := make([]byte, size)
	req := uintptr(kvmGetXSAVE)
	if size > xsaveLegacySize {
		req = kvmGetXSAVE2
	}
	if err := ioctlBytes(fd, req, b); err != nil {
		return nil, opError(fmt.Sprintf("getting XSAVE of vCPU %d", c.id), err, CapXSAVE)
	}
	return b, nil
}

// SetXSAVE writes the vCPU's XSAVE area (KVM_SET_XSAVE). KVM reads as many
// bytes as VM.XSAVESize says, so b must be at least that long.
func (c *VCPU) SetXSAVE(b []byte) error {
	if len(b) < xsaveLegacySize {
		return fmt.Errorf("setting XSAVE of vCPU %d: %d bytes, want at least %d", c.id, len(b), xsaveLegacySize)
	}
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	if err := ioctlBytes(fd, kvmSetXSAVE, b); err != nil {
		return opError(fmt.Sprintf("setting XSAVE of vCPU %d", c.id), err, CapXSAVE)
	}
	return nil
}

// XCRs reads the extended control registers (KVM_GET_XCRS): XCR0, the
// XSAVE feature mask, on today's CPUs.
func (c *VCPU) XCRs() ([]XCR, error) {
	var a xcrsArg
	if err := vcpuIoctl(c, "getting XCRs", kvmGetXCRs, &a, CapXCRs); err != nil {
		return nil, err
	}
	n := min(int(a.NrXCRs), maxXCRs)
	return append([]XCR(nil), a.XCRs[:n]...), nil
}

// SetXCRs writes the extended control registers (KVM_SET_XCRS).
func (c *VCPU) SetXCRs(xcrs []XCR) error {
	if len(xcrs) > maxXCRs {
		return fmt.Errorf("setting XCRs of vCPU %d: %d registers, at most %d", c.id, len(xcrs), maxXCRs)
	}
	a := xcrsArg{NrXCRs: uint32(len(xcrs))}
	copy(a.XCRs[:], xcrs)
	return vcpuIoctl(c, "setting XCRs", kvmSetXCRs, &a, CapXCRs)
}

// MSRIndexList returns the MSRs KVM saves and restores for a guest
// (KVM_GET_MSR_INDEX_LIST): the set a migration must carry. Not every one
// is readable on every vCPU (some depend on the guest's CPUID).
func (s *System) MSRIndexList() ([]uint32, error) {
	fd, err := s.rawFd()
	if err != nil {
		return nil, err
	}
	b := msrListBuffer(0)
	// The first call fails with E2BIG and says how many there are.
	if err := ioctlBytes(fd, kvmGetMSRIndexList, b); err != nil && !errors.Is(err, unix.E2BIG) {
		return nil, fmt.Errorf("getting MSR index list: %w", err)
	}
	for range 4 {
		b = msrListBuffer(msrListCount(b))
		err := ioctlBytes(fd, kvmGetMSRIndexList, b)
		if errors.Is(err, unix.E2BIG) {
			continue // the list grew between the calls
		}
		if err != nil {
			return nil, fmt.Errorf("getting MSR index list: %w", err)
		}
		return msrListIndices(b), nil
	}
	return nil, fmt.Errorf("getting MSR index list: the list keeps growing")
}

// MSRs reads the MSRs of indices (KVM_GET_MSRS). KVM stops at the first it
// cannot read: the result holds the entries read, in order, and is
// shorter than indices when one failed (indices[len(result)]).
func (c *VCPU) MSRs(indices []uint32) ([]MSREntry, error) {
	if len(indices) == 0 {
		return nil, nil
	}
	fd, err := c.rawFd()
	if err != nil {
		return nil, err
	}
	entries := make([]MSREntry, len(indices))
	for i, idx := range indices {
		entries[i].Index = idx
	}
	b := msrsPack(entries)
	n, err := ioctlBytesResult(fd, kvmGetMSRs, b)
	if err != nil {
		return nil, fmt.Errorf("getting MSRs of vCPU %d: %w", c.id, err)
	}
	return msrsUnpack(b, int(n)), nil
}

// SetMSRs writes entries (KVM_SET_MSRS); any MSR KVM refuses is an error
// that names it.
func (c *VCPU) SetMSRs(entries []MSREntry) error {
	if len(entries) == 0 {
		return nil
	}
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	b := msrsPack(entries)
	n, err := ioctlBytesResult(fd, kvmSetMSRs, b)
	if err != nil {
		return fmt.Errorf("setting MSRs of vCPU %d: %w", c.id, err)
	}
	if int(n) < len(entries) {
		return fmt.Errorf("setting MSRs of vCPU %d: KVM refused MSR %#x (%d of %d set)", c.id, entries[n].Index, n, len(entries))
	}
	return nil
}

// LAPIC reads the in-kernel local APIC's registers (KVM_GET_LAPIC); on a
// VM without CreateIRQChip it is ErrNoIRQChip.
func (c *VCPU) LAPIC() (LAPICState, error) {
	var l LAPICState
	err := vcpuIoctl(c, "getting LAPIC", kvmGetLAPIC, &l, CapIRQChip)
	return l, noIRQChipIf(err)
}

// SetLAPIC writes the in-kernel local APIC's registers (KVM_SET_LAPIC).
func (c *VCPU) SetLAPIC(l LAPICState) error {
	return vcpuIoctl(c, "setting LAPIC", kvmSetLAPIC, &l, CapIRQChip)
}

// noIRQChipIf marks KVM_GET_LAPIC's EINVAL, its only answer when the
// local APIC is not in the kernel, as ErrNoIRQChip.
func noIRQChipIf(err error) error {
	if errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("%w: %w", err, ErrNoIRQChip)
	}
	return err
}

// VCPUEvents reads pending and injected events (KVM_GET_VCPU_EVENTS).
func (c *VCPU) VCPUEvents() (VCPUEvents, error) {
	var e VCPUEvents
	err := vcpuIoctl(c, "getting vCPU events", kvmGetVCPUEvents, &e, CapVCPUEvents)
	return e, err
}

// SetVCPUEvents writes pending and injected events (KVM_SET_VCPU_EVENTS);
// e.Flags say which optional fields to take.
func (c *VCPU) SetVCPUEvents(e VCPUEvents) error {
	return vcpuIoctl(c, "setting vCPU events", kvmSetVCPUEvents, &e, CapVCPUEvents)
}

// MPState reads the multiprocessing state (KVM_GET_MP_STATE).
func (c *VCPU) MPState() (MPState, error) {
	var s MPState
	err := vcpuIoctl(c, "getting MP state", kvmGetMPState, &s, CapMPState)
	return s, err
}

// SetMPState writes the multiprocessing state (KVM_SET_MP_STATE). Without
// the in-kernel irqchip only MPStateRunnable is accepted.
func (c *VCPU) SetMPState(s MPState) error {
	return vcpuIoctl(c, "setting MP state", kvmSetMPState, &s, CapMPState)
}

// CPUID2 reads the CPUID leaves set with SetCPUID2 (KVM_GET_CPUID2); none
// before SetCPUID2.
func (c *VCPU) CPUID2() ([]CPUIDEntry2, error) {
	fd, err := c.rawFd()
	if err != nil {
		return nil, err
	}
	for n := 64; n <= 4096; n *= 2 {
		b := cpuidBuffer(n)
		view[cpuid2Header](b, 0).Nent = uint32(n)
		err := ioctlBytes(fd, kvmGetCPUID2, b)
		if errors.Is(err, unix.E2BIG) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("getting CPUID of vCPU %d: %w", c.id, err)
		}
		return cpuidEntries(b), nil
	}
	return nil, fmt.Errorf("getting CPUID of vCPU %d: more than 4096 entries", c.id)
}

// CompletePendingIO finishes the IO or MMIO instruction of the last exit
// without running any further guest instruction: KVM completes it only on
// the next KVM_RUN, and until then RIP and the registers do not show it
// done. It enters KVM_RUN with kvm_run.immediate_exit set (which returns
// EINTR at once, KVM_CAP_IMMEDIATE_EXIT) and clears the flag again. Call
// it, on the vCPU's thread, before saving state after an exit.
func (c *VCPU) CompletePendingIO() error {
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	hdr := view[runHeader](c.runPage(), 0)
	hdr.ImmediateExit = 1
	defer func() { hdr.ImmediateExit = 0 }()
	_, err = ioctl(fd, kvmRun, 0)
	switch {
	case errors.Is(err, unix.EINTR):
		return nil
	case err != nil:
		return fmt.Errorf("completing pending IO of vCPU %d: %w", c.id, err)
	default:
		// immediate_exit unknown to this KVM: the guest ran to another exit.
		return fmt.Errorf("completing pending IO of vCPU %d: KVM_RUN did not exit at once (exit %v): %w",
			c.id, c.ExitReason(), &CapabilityError{Op: "exiting KVM_RUN at once", Cap: CapImmediateExit})
	}
}

// vcpuIoctl issues the vCPU ioctl req on *p; op names it in errors, and a
// kernel that does not know req (ENOTTY) lacks capability cp.
func vcpuIoctl[T any](c *VCPU, op string, req uintptr, p *T, cp Capability) error {
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	if err := ioctlPtr(fd, req, p); err != nil {
		return opError(fmt.Sprintf("%s of vCPU %d", op, c.id), err, cp)
	}
	return nil
}
