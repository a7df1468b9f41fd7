package kvm

import (
	"errors"
	"fmt"
	"slices"
)

// VCPUState is a vCPU's whole architectural state as plain data: what a
// live migration carries to recreate the vCPU on another host. Optional
// pieces are nil (or zero) when the source did not have them; Restore
// skips those. MarshalBinary and UnmarshalBinary give it a stable,
// versioned encoding (vcpu_state_codec.go).
type VCPUState struct {
	// CPUID is what SetCPUID2 gave the vCPU (nil when never set). Restore
	// sets it first: KVM checks MSRs and XSAVE against it.
	CPUID []CPUIDEntry2
	// TSCKHz is the TSC frequency (0 when the host could not say).
	TSCKHz uint32

	Regs  Regs
	Sregs Sregs
	// FPU is the x87 and SSE registers, without MXCSR (see FPU): on a host
	// without XSAVE, MXCSR is not carried.
	FPU FPU
	// XSAVE is the XSAVE area (nil without KVM_CAP_XSAVE); it includes
	// the x87 and SSE state of FPU and, where set, AVX and beyond.
	XSAVE []byte
	// XCRs are the extended control registers (nil without KVM_CAP_XCRS).
	XCRs []XCR
	// MSRs are the readable MSRs of the host's save list, TSC among them.
	MSRs []MSREntry
	// LAPIC is the in-kernel local APIC (nil without CreateIRQChip).
	LAPIC *LAPICState
	// DebugRegs are DR0-DR3, DR6 and DR7 (nil without KVM_CAP_DEBUGREGS).
	DebugRegs *DebugRegs
	Events    VCPUEvents
	MP        MPState
}

// StateSpec is what SaveState captures, computed once per VM by
// VM.StateSpec: plain data, so it can be checked or logged, but for the
// VM it was made from, which sizes the XSAVE area.
type StateSpec struct {
	// MSRs are the candidate MSRs: KVM_GET_MSR_INDEX_LIST's and
	// unlistedMSRs; SaveState keeps those the vCPU can read.
	MSRs []uint32
	// XSAVESize is the XSAVE area's bytes, 0 without KVM_CAP_XSAVE.
	XSAVESize int
	// XCRs reports KVM_CAP_XCRS.
	XCRs bool

	// vm sizes the XSAVE area KVM reads and writes; nil in a StateSpec
	// not made by VM.StateSpec, which then saves and restores no XSAVE.
	vm *VM
}

// StateSpec returns what SaveState captures on this VM's vCPUs. It asks
// the System the VM was made from for the MSR list, so that must be open.
func (vm *VM) StateSpec() (StateSpec, error) {
	s := StateSpec{vm: vm}
	msrs, err := vm.sys.MSRIndexList()
	if err != nil {
		return s, fmt.Errorf("describing vCPU state: %w", err)
	}
	s.MSRs = slices.Clone(msrs)
	for _, m := range unlistedMSRs() {
		if !slices.Contains(msrs, m) {
			s.MSRs = append(s.MSRs, m)
		}
	}
	switch n, err := vm.XSAVESize(); {
	case errors.Is(err, ErrNotSupported):
	case err != nil:
		return s, fmt.Errorf("describing vCPU state: %w", err)
	default:
		s.XSAVESize = n
	}
	xcrs, err := vm.CheckExtension(CapXCRs)
	if err != nil {
		return s, fmt.Errorf("describing vCPU state: %w", err)
	}
	s.XCRs = xcrs != 0
	return s, nil
}

// SaveState captures the vCPU's state. The vCPU must be stopped (not in
// Run), its last exit handled (an IN's or MMIO read's data filled in),
// and SaveState must run on its thread: it first completes that exit's IO
// (CompletePendingIO), since KVM's state shows an OUT or IN done only
// after that. Pieces the host or VM lacks (XSAVE, XCRs, LAPIC without
// the in-kernel irqchip, debug registers, the TSC frequency) are left nil.
func (c *VCPU) SaveState(spec StateSpec) (*VCPUState, error) {
	s, err := c.saveState(spec)
	if err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	return s, nil
}

func (c *VCPU) saveState(spec StateSpec) (*VCPUState, error) {
	if err := c.CompletePendingIO(); err != nil {
		return nil, err
	}
	s := &VCPUState{}
	var err error
	if s.CPUID, err = c.CPUID2(); err != nil {
		return nil, err
	}
	if len(s.CPUID) == 0 {
		s.CPUID = nil
	}
	khz, err := optional(c.TSCKHz, ErrNotSupported)
	if err != nil {
		return nil, err
	}
	if khz != nil {
		s.TSCKHz = *khz
	}
	if s.Regs, err = c.Regs(); err != nil {
		return nil, err
	}
	if s.Sregs, err = c.Sregs(); err != nil {
		return nil, err
	}
	if s.FPU, err = c.FPU(); err != nil {
		return nil, err
	}
	if spec.XSAVESize > 0 && spec.vm != nil {
		if s.XSAVE, err = c.XSAVE(spec.vm); err != nil {
			return nil, err
		}
	}
	if spec.XCRs {
		if s.XCRs, err = c.XCRs(); err != nil {
			return nil, err
		}
	}
	if s.MSRs, err = c.readableMSRs(spec.MSRs); err != nil {
		return nil, err
	}
	if s.LAPIC, err = optional(c.LAPIC, ErrNoIRQChip); err != nil {
		return nil, err
	}
	if s.DebugRegs, err = optional(c.DebugRegs, ErrNotSupported); err != nil {
		return nil, err
	}
	if s.Events, err = c.VCPUEvents(); err != nil {
		return nil, err
	}
	if s.MP, err = c.MPState(); err != nil {
		return nil, err
	}
	return s, nil
}

// optional calls get and returns a pointer to its result, or nil when its
// error is absent (the piece of state this host or VM does not have).
func optional[T any](get func() (T, error), absent error) (*T, error) {
	v, err := get()
	if errors.Is(err, absent) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &v, nil
}

// readableMSRs reads every MSR of indices the vCPU can read, skipping
// those KVM refuses (KVM_GET_MSRS stops at the first): some of the host's
// list depend on the guest's CPUID or on features not enabled.
func (c *VCPU) readableMSRs(indices []uint32) ([]MSREntry, error) {
	var out []MSREntry
	for len(indices) > 0 {
		got, err := c.MSRs(indices)
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
		// indices[len(got)] was refused (if any): skip it.
		indices = indices[min(len(got)+1, len(indices)):]
	}
	return out, nil
}

// RestoreState loads s into the vCPU, which must be new (never run) in a
// VM set up like the source's: the same memory, and CreateIRQChip when s
// has a LAPIC. spec is the target VM's (VM.StateSpec): it sizes the XSAVE
// area KVM reads. The order is KVM's: CPUID first (MSRs and XSAVE are checked
// against it), the TSC frequency before the TSC, sregs (CR0/CR4/EFER and
// the APIC base) before regs, the LAPIC after the APIC base and before the
// MSRs (the TSC deadline MSR needs the LAPIC's timer mode), the debug
// registers, and the vCPU events and MP state last, since setting
// registers clears pending events.
func (c *VCPU) RestoreState(s *VCPUState, spec StateSpec) error {
	if err := c.restoreState(s, spec); err != nil {
		return fmt.Errorf("restoring vCPU state: %w", err)
	}
	return nil
}

func (c *VCPU) restoreState(s *VCPUState, spec StateSpec) error {
	if len(s.CPUID) > 0 {
		if err := c.SetCPUID2(s.CPUID); err != nil {
			return err
		}
	}
	if s.TSCKHz != 0 {
		if err := c.restoreTSCKHz(s.TSCKHz); err != nil {
			return err
		}
	}
	if err := c.SetSregs(s.Sregs); err != nil {
		return err
	}
	if err := c.SetRegs(s.Regs); err != nil {
		return err
	}
	if err := c.SetFPU(s.FPU); err != nil {
		return err
	}
	if s.XSAVE != nil {
		if spec.vm == nil {
			return fmt.Errorf("setting XSAVE of vCPU %d: the StateSpec is not the VM's (VM.StateSpec)", c.id)
		}
		if err := c.SetXSAVE(spec.vm, s.XSAVE); err != nil {
			return err
		}
	}
	if s.XCRs != nil {
		if err := c.SetXCRs(s.XCRs); err != nil {
			return err
		}
	}
	if s.LAPIC != nil {
		if err := c.SetLAPIC(*s.LAPIC); err != nil {
			return err
		}
	}
	if err := c.SetMSRs(s.MSRs); err != nil {
		return err
	}
	if tsc, ok := s.MSR(MSRIA32TSC); ok {
		if err := c.settleTSC(tsc, s.TSCKHz); err != nil {
			return err
		}
	}
	if s.DebugRegs != nil {
		if err := c.SetDebugRegs(*s.DebugRegs); err != nil {
			return err
		}
	}
	if err := c.SetVCPUEvents(s.Events); err != nil {
		return err
	}
	return c.SetMPState(s.MP)
}

// restoreTSCKHz sets the TSC frequency when the target's differs.
func (c *VCPU) restoreTSCKHz(khz uint32) error {
	cur, err := c.TSCKHz()
	if errors.Is(err, ErrNotSupported) || err == nil && cur == khz {
		return nil
	}
	if err != nil {
		return err
	}
	return c.SetTSCKHz(khz)
}

// MSR returns the saved value of MSR index and whether s has it.
func (s *VCPUState) MSR(index uint32) (uint64, bool) {
	i := slices.IndexFunc(s.MSRs, func(e MSREntry) bool { return e.Index == index })
	if i < 0 {
		return 0, false
	}
	return s.MSRs[i].Data, true
}

// MSRIA32TSC is the time-stamp counter's MSR (IA32_TIME_STAMP_COUNTER).
const MSRIA32TSC = 0x10

// unlistedMSRs are MSRs KVM emulates for every guest and restores from
// user space but leaves out of KVM_GET_MSR_INDEX_LIST, which names only
// those whose presence varies: the MTRRs (a guest's memory types) and the
// machine-check banks. MTRRcap and MCG_CAP are not among them: they are
// read-only to KVM_SET_MSRS.
func unlistedMSRs() []uint32 {
	const (
		mtrrPhysBase0 = 0x200 // eight base/mask pairs (KVM_NR_VAR_MTRR)
		mtrrFix64K    = 0x250
		mtrrFix16K    = 0x258 // and 0x259
		mtrrFix4K     = 0x268 // to 0x26f
		mtrrDefType   = 0x2ff
		mc0Ctl        = 0x400 // CTL, STATUS, ADDR, MISC per bank
		maxMCEBanks   = 32    // KVM_MAX_MCE_BANKS
	)
	var m []uint32
	for i := range uint32(16) {
		m = append(m, mtrrPhysBase0+i)
	}
	m = append(m, mtrrFix64K, mtrrFix16K, mtrrFix16K+1)
	for i := range uint32(8) {
		m = append(m, mtrrFix4K+i)
	}
	m = append(m, mtrrDefType)
	for i := range uint32(4 * maxMCEBanks) {
		m = append(m, mc0Ctl+i)
	}
	return m
}
