package vmm

import (
	"tern/vmm/boot"
	"tern/vmm/kvm"
)

// setCPUState applies the boot state st to cpu (KVM_SET_SREGS, then
// KVM_SET_REGS), keeping what st does not describe (the APIC base).
func setCPUState(cpu *kvm.VCPU, st boot.CPUState) error {
	s, err := cpu.Sregs()
	if err != nil {
		return err
	}
	s.CS, s.DS, s.ES, s.FS = st.CS, st.DS, st.ES, st.FS
	s.GS, s.SS, s.TR, s.LDT = st.GS, st.SS, st.TR, st.LDT
	s.GDT, s.IDT = st.GDT, st.IDT
	s.CR0, s.CR3, s.CR4, s.EFER = st.CR0, st.CR3, st.CR4, st.EFER
	if err := cpu.SetSregs(s); err != nil {
		return err
	}
	return cpu.SetRegs(kvm.Regs{RIP: st.RIP, RSP: st.RSP, RFLAGS: st.RFLAGS, RSI: st.RSI})
}

// CPUID leaves that carry a CPU's APIC ID.
const (
	cpuidFeatures         = 0x1  // EBX bits 31-24: initial APIC ID
	cpuidExtTopology      = 0xb  // EDX, every subleaf: x2APIC ID
	cpuidExtTopologyV2    = 0x1f // the same
	cpuidInitialAPICShift = 24
)

// cpuidFor returns the supported CPUID leaves with vCPU id's APIC ID
// (KVM gives vCPU id local APIC ID id) where CPUID reports it: leaf 1's
// initial APIC ID and, where present, the extended topology leaves' x2APIC
// ID. KVM_GET_SUPPORTED_CPUID leaves them to the VMM; a kernel that reads
// an ID there other than its local APIC's reports "APIC id mismatch" and
// gets its topology wrong.
func cpuidFor(supported []kvm.CPUIDEntry2, id int) []kvm.CPUIDEntry2 {
	out := append([]kvm.CPUIDEntry2(nil), supported...)
	for i := range out {
		switch out[i].Function {
		case cpuidFeatures:
			out[i].EBX = out[i].EBX&0x00ffffff | uint32(id)<<cpuidInitialAPICShift
		case cpuidExtTopology, cpuidExtTopologyV2:
			out[i].EDX = uint32(id)
		}
	}
	return out
}
