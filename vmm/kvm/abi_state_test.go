package kvm

import (
	"testing"
	"unsafe"
)

// TestStateABISizes pins the structs of abi_state.go to linux/kvm.h's and
// asm/kvm.h's x86-64 layout.
func TestStateABISizes(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"kvm_irq_level", unsafe.Sizeof(irqLevel{}), 8},
		{"kvm_pit_config", unsafe.Sizeof(pitConfig{}), 64},
		{"kvm_irqfd", unsafe.Sizeof(irqfdArg{}), 32},
		{"kvm_ioeventfd", unsafe.Sizeof(ioeventfdArg{}), 64},
		{"kvm_enable_cap", unsafe.Sizeof(enableCapArg{}), 104},
		{"kvm_fpu", unsafe.Sizeof(FPU{}), 416},
		{"kvm_msr_entry", unsafe.Sizeof(MSREntry{}), 16},
		{"kvm_msrs", unsafe.Sizeof(msrsHeader{}), 8},
		{"kvm_msr_list", unsafe.Sizeof(msrListHeader{}), 4},
		{"kvm_xcr", unsafe.Sizeof(XCR{}), 16},
		{"kvm_xcrs", unsafe.Sizeof(xcrsArg{}), 392},
		{"kvm_lapic_state", unsafe.Sizeof(LAPICState{}), 1024},
		{"kvm_irqchip", unsafe.Sizeof(IRQChipState{}), 520},
		{"kvm_pit_state2", unsafe.Sizeof(PITState{}), 112},
		{"kvm_vcpu_events", unsafe.Sizeof(VCPUEvents{}), 64},
		{"kvm_mp_state", unsafe.Sizeof(MPState(0)), 4},
		{"kvm_debugregs", unsafe.Sizeof(DebugRegs{}), 128},
		{"kvm_clock_data", unsafe.Sizeof(ClockData{}), 48},
		{"kvm_dirty_log", unsafe.Sizeof(dirtyLogArg{}), 16},
		{"kvm_clear_dirty_log", unsafe.Sizeof(clearDirtyLogArg{}), 24},
		{"kvm_dirty_gfn", unsafe.Sizeof(dirtyGFN{}), 16},
	} {
		if c.got != c.want {
			t.Errorf("sizeof(%s) = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestStateABIOffsets pins the fields whose place is easy to get wrong.
func TestStateABIOffsets(t *testing.T) {
	var ev VCPUEvents
	for _, c := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"kvm_fpu.fcw", unsafe.Offsetof(FPU{}.FCW), 128},
		{"kvm_fpu.last_ip", unsafe.Offsetof(FPU{}.LastIP), 136},
		{"kvm_fpu.xmm", unsafe.Offsetof(FPU{}.XMM), 152},
		{"kvm_fpu.mxcsr", unsafe.Offsetof(FPU{}.MXCSR), 408},
		{"kvm_irqfd.resamplefd", unsafe.Offsetof(irqfdArg{}.ResampleFD), 12},
		{"kvm_ioeventfd.len", unsafe.Offsetof(ioeventfdArg{}.Len), 16},
		{"kvm_ioeventfd.fd", unsafe.Offsetof(ioeventfdArg{}.FD), 20},
		{"kvm_ioeventfd.flags", unsafe.Offsetof(ioeventfdArg{}.Flags), 24},
		{"kvm_enable_cap.args", unsafe.Offsetof(enableCapArg{}.Args), 8},
		{"kvm_msr_entry.data", unsafe.Offsetof(MSREntry{}.Data), 8},
		{"kvm_xcrs.xcrs", unsafe.Offsetof(xcrsArg{}.XCRs), 8},
		{"kvm_xcr.value", unsafe.Offsetof(XCR{}.Value), 8},
		{"kvm_vcpu_events.interrupt", unsafe.Offsetof(ev.Interrupt), 8},
		{"kvm_vcpu_events.nmi", unsafe.Offsetof(ev.NMI), 12},
		{"kvm_vcpu_events.sipi_vector", unsafe.Offsetof(ev.SIPIVector), 16},
		{"kvm_vcpu_events.flags", unsafe.Offsetof(ev.Flags), 20},
		{"kvm_vcpu_events.smi", unsafe.Offsetof(ev.SMI), 24},
		{"kvm_vcpu_events.triple_fault", unsafe.Offsetof(ev.TripleFaultPending), 28},
		{"kvm_vcpu_events.exception_has_payload", unsafe.Offsetof(ev.ExceptionHasPayload), 55},
		{"kvm_vcpu_events.exception_payload", unsafe.Offsetof(ev.ExceptionPayload), 56},
		{"kvm_vcpu_events.exception.error_code", unsafe.Offsetof(ev.Exception.ErrorCode), 4},
		{"kvm_clock_data.flags", unsafe.Offsetof(ClockData{}.Flags), 8},
		{"kvm_clock_data.realtime", unsafe.Offsetof(ClockData{}.Realtime), 16},
		{"kvm_clock_data.host_tsc", unsafe.Offsetof(ClockData{}.HostTSC), 24},
		{"kvm_dirty_log.dirty_bitmap", unsafe.Offsetof(dirtyLogArg{}.Bitmap), 8},
		{"kvm_clear_dirty_log.first_page", unsafe.Offsetof(clearDirtyLogArg{}.FirstPage), 8},
		{"kvm_clear_dirty_log.dirty_bitmap", unsafe.Offsetof(clearDirtyLogArg{}.Bitmap), 16},
		{"kvm_dirty_gfn.offset", unsafe.Offsetof(dirtyGFN{}.Offset), 8},
		{"kvm_debugregs.dr6", unsafe.Offsetof(DebugRegs{}.DR6), 32},
		{"kvm_debugregs.flags", unsafe.Offsetof(DebugRegs{}.Flags), 48},
	} {
		if c.got != c.want {
			t.Errorf("offsetof(%s) = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestStateIoctlNumbers recomputes the request numbers of abi_state.go
// from the struct sizes.
func TestStateIoctlNumbers(t *testing.T) {
	const kvmio = 0xAE
	ioc := func(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | kvmio<<8 | nr }
	const r, w = 2, 1
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"KVM_GET_MSR_INDEX_LIST", kvmGetMSRIndexList, ioc(r|w, 0x02, unsafe.Sizeof(msrListHeader{}))},
		{"KVM_GET_DIRTY_LOG", kvmGetDirtyLog, ioc(w, 0x42, unsafe.Sizeof(dirtyLogArg{}))},
		{"KVM_CREATE_IRQCHIP", kvmCreateIRQChip, ioc(0, 0x60, 0)},
		{"KVM_IRQ_LINE", kvmIRQLine, ioc(w, 0x61, unsafe.Sizeof(irqLevel{}))},
		{"KVM_GET_IRQCHIP", kvmGetIRQChip, ioc(r|w, 0x62, unsafe.Sizeof(IRQChipState{}))},
		{"KVM_SET_IRQCHIP", kvmSetIRQChip, ioc(r, 0x63, unsafe.Sizeof(IRQChipState{}))},
		{"KVM_GET_PIT2", kvmGetPIT2, ioc(r, 0x9f, unsafe.Sizeof(PITState{}))},
		{"KVM_SET_PIT2", kvmSetPIT2, ioc(w, 0xa0, unsafe.Sizeof(PITState{}))},
		{"KVM_IRQFD", kvmIRQFD, ioc(w, 0x76, unsafe.Sizeof(irqfdArg{}))},
		{"KVM_CREATE_PIT2", kvmCreatePIT2, ioc(w, 0x77, unsafe.Sizeof(pitConfig{}))},
		{"KVM_IOEVENTFD", kvmIOEventFD, ioc(w, 0x79, unsafe.Sizeof(ioeventfdArg{}))},
		{"KVM_SET_CLOCK", kvmSetClock, ioc(w, 0x7b, unsafe.Sizeof(ClockData{}))},
		{"KVM_GET_CLOCK", kvmGetClock, ioc(r, 0x7c, unsafe.Sizeof(ClockData{}))},
		{"KVM_GET_MSRS", kvmGetMSRs, ioc(r|w, 0x88, unsafe.Sizeof(msrsHeader{}))},
		{"KVM_SET_MSRS", kvmSetMSRs, ioc(w, 0x89, unsafe.Sizeof(msrsHeader{}))},
		{"KVM_SET_DEVICE_ATTR", kvmSetDeviceAttr, ioc(w, 0xe1, unsafe.Sizeof(deviceAttr{}))},
		{"KVM_GET_DEVICE_ATTR", kvmGetDeviceAttr, ioc(w, 0xe2, unsafe.Sizeof(deviceAttr{}))},
		{"KVM_GET_FPU", kvmGetFPU, ioc(r, 0x8c, unsafe.Sizeof(FPU{}))},
		{"KVM_SET_FPU", kvmSetFPU, ioc(w, 0x8d, unsafe.Sizeof(FPU{}))},
		{"KVM_GET_LAPIC", kvmGetLAPIC, ioc(r, 0x8e, unsafe.Sizeof(LAPICState{}))},
		{"KVM_SET_LAPIC", kvmSetLAPIC, ioc(w, 0x8f, unsafe.Sizeof(LAPICState{}))},
		{"KVM_GET_CPUID2", kvmGetCPUID2, ioc(r|w, 0x91, unsafe.Sizeof(cpuid2Header{}))},
		{"KVM_GET_MP_STATE", kvmGetMPState, ioc(r, 0x98, unsafe.Sizeof(MPState(0)))},
		{"KVM_SET_MP_STATE", kvmSetMPState, ioc(w, 0x99, unsafe.Sizeof(MPState(0)))},
		{"KVM_GET_VCPU_EVENTS", kvmGetVCPUEvents, ioc(r, 0x9f, unsafe.Sizeof(VCPUEvents{}))},
		{"KVM_SET_VCPU_EVENTS", kvmSetVCPUEvents, ioc(w, 0xa0, unsafe.Sizeof(VCPUEvents{}))},
		{"KVM_GET_DEBUGREGS", kvmGetDebugRegs, ioc(r, 0xa1, unsafe.Sizeof(DebugRegs{}))},
		{"KVM_SET_DEBUGREGS", kvmSetDebugRegs, ioc(w, 0xa2, unsafe.Sizeof(DebugRegs{}))},
		{"KVM_SET_TSC_KHZ", kvmSetTSCKHz, ioc(0, 0xa2, 0)},
		{"KVM_GET_TSC_KHZ", kvmGetTSCKHz, ioc(0, 0xa3, 0)},
		{"KVM_ENABLE_CAP", kvmEnableCap, ioc(w, 0xa3, unsafe.Sizeof(enableCapArg{}))},
		{"KVM_GET_XSAVE", kvmGetXSAVE, ioc(r, 0xa4, xsaveLegacySize)},
		{"KVM_SET_XSAVE", kvmSetXSAVE, ioc(w, 0xa5, xsaveLegacySize)},
		{"KVM_GET_XCRS", kvmGetXCRs, ioc(r, 0xa6, unsafe.Sizeof(xcrsArg{}))},
		{"KVM_SET_XCRS", kvmSetXCRs, ioc(w, 0xa7, unsafe.Sizeof(xcrsArg{}))},
		{"KVM_CLEAR_DIRTY_LOG", kvmClearDirtyLog, ioc(r|w, 0xc0, unsafe.Sizeof(clearDirtyLogArg{}))},
		{"KVM_RESET_DIRTY_RINGS", kvmResetDirtyRings, ioc(0, 0xc7, 0)},
		{"KVM_GET_XSAVE2", kvmGetXSAVE2, ioc(r, 0xcf, xsaveLegacySize)},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}
