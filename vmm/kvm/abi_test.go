package kvm

import (
	"testing"
	"unsafe"
)

// TestABISizes pins every struct handed to the kernel to linux/kvm.h's
// x86-64 layout.
func TestABISizes(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"kvm_regs", unsafe.Sizeof(Regs{}), 144},
		{"kvm_segment", unsafe.Sizeof(Segment{}), 24},
		{"kvm_dtable", unsafe.Sizeof(DTable{}), 16},
		{"kvm_sregs", unsafe.Sizeof(Sregs{}), 312},
		{"kvm_cpuid_entry2", unsafe.Sizeof(CPUIDEntry2{}), 40},
		{"kvm_cpuid2", unsafe.Sizeof(cpuid2Header{}), 8},
		{"kvm_userspace_memory_region", unsafe.Sizeof(userspaceMemoryRegion{}), 32},
		{"kvm_run header", unsafe.Sizeof(runHeader{}), runExitOffset},
		{"kvm_run.io", unsafe.Sizeof(ioExit{}), 16},
		{"kvm_run.mmio", unsafe.Sizeof(mmioExit{}), 24},
	} {
		if c.got != c.want {
			t.Errorf("sizeof(%s) = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestABIOffsets pins the fields whose place is easy to get wrong.
func TestABIOffsets(t *testing.T) {
	for _, c := range []struct {
		name string
		got  uintptr
		want uintptr
	}{
		{"kvm_regs.rip", unsafe.Offsetof(Regs{}.RIP), 128},
		{"kvm_segment.type", unsafe.Offsetof(Segment{}.Type), 14},
		{"kvm_segment.unusable", unsafe.Offsetof(Segment{}.Unusable), 22},
		{"kvm_sregs.gdt", unsafe.Offsetof(Sregs{}.GDT), 192},
		{"kvm_sregs.cr0", unsafe.Offsetof(Sregs{}.CR0), 224},
		{"kvm_sregs.efer", unsafe.Offsetof(Sregs{}.EFER), 264},
		{"kvm_sregs.interrupt_bitmap", unsafe.Offsetof(Sregs{}.InterruptBitmap), 280},
		{"kvm_cpuid_entry2.eax", unsafe.Offsetof(CPUIDEntry2{}.EAX), 12},
		{"kvm_run.exit_reason", unsafe.Offsetof(runHeader{}.ExitReason), 8},
		{"kvm_run.cr8", unsafe.Offsetof(runHeader{}.CR8), 16},
		{"kvm_run.io.port", unsafe.Offsetof(ioExit{}.Port), 2},
		{"kvm_run.io.data_offset", unsafe.Offsetof(ioExit{}.DataOffset), 8},
		{"kvm_run.mmio.len", unsafe.Offsetof(mmioExit{}.Len), 16},
	} {
		if c.got != c.want {
			t.Errorf("offsetof(%s) = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestIoctlNumbers recomputes the _IOR/_IOW/_IOWR request numbers from the
// struct sizes.
func TestIoctlNumbers(t *testing.T) {
	const kvmio = 0xAE
	ioc := func(dir, nr, size uintptr) uintptr { return dir<<30 | size<<16 | kvmio<<8 | nr }
	const r, w = 2, 1
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"KVM_GET_SUPPORTED_CPUID", kvmGetSupportedCPUID, ioc(r|w, 0x05, unsafe.Sizeof(cpuid2Header{}))},
		{"KVM_SET_USER_MEMORY_REGION", kvmSetUserMemoryRegion, ioc(w, 0x46, unsafe.Sizeof(userspaceMemoryRegion{}))},
		{"KVM_GET_REGS", kvmGetRegs, ioc(r, 0x81, unsafe.Sizeof(Regs{}))},
		{"KVM_SET_REGS", kvmSetRegs, ioc(w, 0x82, unsafe.Sizeof(Regs{}))},
		{"KVM_GET_SREGS", kvmGetSregs, ioc(r, 0x83, unsafe.Sizeof(Sregs{}))},
		{"KVM_SET_SREGS", kvmSetSregs, ioc(w, 0x84, unsafe.Sizeof(Sregs{}))},
		{"KVM_SET_CPUID2", kvmSetCPUID2, ioc(w, 0x90, unsafe.Sizeof(cpuid2Header{}))},
	} {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.name, c.got, c.want)
		}
	}
}

func TestCPUIDPackRoundTrip(t *testing.T) {
	in := []CPUIDEntry2{{Function: 0, EAX: 0xd}, {Function: 1, Index: 2, ECX: 1 << 31}}
	out := cpuidEntries(cpuidPack(in))
	if len(out) != len(in) || out[0] != in[0] || out[1] != in[1] {
		t.Fatalf("round trip = %+v, want %+v", out, in)
	}
}

func TestExitReasonString(t *testing.T) {
	if got := ExitHLT.String(); got != "HLT" {
		t.Errorf("ExitHLT = %q", got)
	}
	if got := ExitReason(999).String(); got != "EXIT_999" {
		t.Errorf("999 = %q", got)
	}
}
