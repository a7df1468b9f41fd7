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
	FPU   FPU
	// XSAVE is the XSAVE area (nil without KVM_CAP_XSAVE); it includes
	// the x87 and SSE state of FPU and, where set, AVX and beyond.
	XSAVE []byte
	// XCRs are the extended control registers (nil without KVM_CAP_XCRS).
	XCRs []XCR
	// MSRs are the readable MSRs of the host's save list, TSC among them.
	MSRs []MSREntry
	// LAPIC is the in-kernel local APIC (nil without CreateIRQChip).
	LAPIC  *LAPICState
	Events VCPUEvents
	MP     MPState
}

// StateSpec is what SaveState captures, computed once per VM by
// VM.StateSpec: plain data, so it can be checked or logged.
type StateSpec struct {
	// MSRs are the candidate MSRs (KVM_GET_MSR_INDEX_LIST); SaveState keeps
	// those the vCPU can read.
	MSRs []uint32
	// XSAVESize is the XSAVE area's bytes, 0 without KVM_CAP_XSAVE.
	XSAVESize int
	// XCRs reports KVM_CAP_XCRS.
	XCRs bool
}

// StateSpec returns what SaveState captures on this VM's vCPUs. It asks
// the System the VM was made from for the MSR list, so that must be open.
func (vm *VM) StateSpec() (StateSpec, error) {
	var s StateSpec
	msrs, err := vm.sys.MSRIndexList()
	if err != nil {
		return s, fmt.Errorf("describing vCPU state: %w", err)
	}
	s.MSRs = msrs
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
// Run) and SaveState must run on its thread: it first completes the IO of
// the last exit (CompletePendingIO), since KVM's state shows an OUT or IN
// done only after that.
func (c *VCPU) SaveState(spec StateSpec) (*VCPUState, error) {
	if err := c.CompletePendingIO(); err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	s := &VCPUState{}
	var err error
	if s.CPUID, err = c.CPUID2(); err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	if len(s.CPUID) == 0 {
		s.CPUID = nil
	}
	switch khz, err := c.TSCKHz(); {
	case errors.Is(err, ErrNotSupported):
	case err != nil:
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	default:
		s.TSCKHz = khz
	}
	if s.Regs, err = c.Regs(); err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	if s.Sregs, err = c.Sregs(); err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	if s.FPU, err = c.FPU(); err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	if spec.XSAVESize > 0 {
		if s.XSAVE, err = c.XSAVE(spec.XSAVESize); err != nil {
			return nil, fmt.Errorf("saving vCPU state: %w", err)
		}
	}
	if spec.XCRs {
		if s.XCRs, err = c.XCRs(); err != nil {
			return nil, fmt.Errorf("saving vCPU state: %w", err)
		}
	}
	if s.MSRs, err = c.readableMSRs(spec.MSRs); err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	switch l, err := c.LAPIC(); {
	case errors.Is(err, ErrNoIRQChip):
	case err != nil:
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	default:
		s.LAPIC = &l
	}
	if s.Events, err = c.VCPUEvents(); err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	if s.MP, err = c.MPState(); err != nil {
		return nil, fmt.Errorf("saving vCPU state: %w", err)
	}
	return s, nil
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
// MSRs (the TSC deadline MSR needs the LAPIC's timer mode), and the vCPU
// events and MP state last, since setting registers clears pending events.
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
		if len(s.XSAVE) > spec.XSAVESize {
			return fmt.Errorf("setting XSAVE of vCPU %d: %d bytes saved, this host's area holds %d", c.id, len(s.XSAVE), spec.XSAVESize)
		}
		// KVM reads the whole area of this host; what the source lacked
		// stays zero (its header's XSTATE_BV says it is not in use).
		area := make([]byte, spec.XSAVESize)
		copy(area, s.XSAVE)
		if err := c.SetXSAVE(area); err != nil {
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
