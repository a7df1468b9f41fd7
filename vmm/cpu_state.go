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

// cpuidFor returns the supported CPUID leaves with vCPU id's initial APIC
// ID in leaf 1.
func cpuidFor(supported []kvm.CPUIDEntry2, id int) []kvm.CPUIDEntry2 {
	out := append([]kvm.CPUIDEntry2(nil), supported...)
	for i := range out {
		if out[i].Function == 1 {
			out[i].EBX = out[i].EBX&0x00ffffff | uint32(id)<<24
		}
	}
	return out
}
