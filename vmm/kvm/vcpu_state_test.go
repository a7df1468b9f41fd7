package kvm_test

import (
	"bytes"
	"encoding/binary"
	"slices"
	"testing"

	"tern/vmm/boot"
	"tern/vmm/kvm"
	"tern/vmm/memory"
)

// The counter guest runs in 64-bit mode and counts in three places: RBX,
// a quadword in memory and XMM0. Each pass of its loop OUTs all three, to
// ports counterRegPort, counterMemPort and counterXMMPort in turn, so a
// vCPU restored elsewhere shows at once whether registers, memory and the
// SSE state came along, and whether the OUT it stopped at ran once.
const (
	counterCodeAddr = 0x100000
	counterDataAddr = 0x180000
	counterRAM      = 2 << 20
	counterRegPort  = 0x10
	counterMemPort  = 0x11
	counterXMMPort  = 0x12
)

// userPrologue is CPL0 code, loaded at counterCodeAddr, that loads the
// TSS and drops with iretq to CPL3 at the code that follows it.
var userPrologue = []byte{
	0x66, 0xb8, tssSelector, 0x00, // mov ax, tssSelector
	0x0f, 0x00, 0xd8, // ltr ax
	0x48, 0x89, 0xe0, // mov rax, rsp
	0x6a, userDataSelector, // push userDataSelector (SS)
	0x50,                         // push rax (RSP)
	0x68, 0x02, 0x30, 0x00, 0x00, // push 0x3002 (RFLAGS: IOPL 3)
	0x6a, userCodeSelector, // push userCodeSelector (CS)
	0x68, 0x1b, 0x00, 0x10, 0x00, // push counterCodeAddr+0x1b (RIP)
	0x48, 0xcf, // iretq
	// counterCodeAddr+0x1b, at CPL3: what follows the prologue.
}

var counterGuest = append(slices.Clip(userPrologue),
	0xb8, 0x01, 0x00, 0x00, 0x00, // mov eax, 1
	0x66, 0x48, 0x0f, 0x6e, 0xc8, // movq xmm1, rax
	0x66, 0x0f, 0xef, 0xc0, // pxor xmm0, xmm0
	// loop:
	0x48, 0xff, 0xc3, // inc rbx
	0x48, 0xff, 0x04, 0x25, 0x00, 0x00, 0x18, 0x00, // inc qword [counterDataAddr]
	0x66, 0x0f, 0xd4, 0xc1, // paddq xmm0, xmm1
	0x89, 0xd8, // mov eax, ebx
	0xe7, counterRegPort, // out counterRegPort, eax
	0x48, 0x8b, 0x04, 0x25, 0x00, 0x00, 0x18, 0x00, // mov rax, [counterDataAddr]
	0xe7, counterMemPort, // out counterMemPort, eax
	0x66, 0x48, 0x0f, 0x7e, 0xc0, // movq rax, xmm0
	0xe7, counterXMMPort, // out counterXMMPort, eax
	0xeb, 0xda, // jmp loop
)

// counterOuts is the sequence of OUTs the counter guest makes for passes
// from..to.
func counterOuts(from, to uint32) []ioExit {
	var outs []ioExit
	for i := from; i <= to; i++ {
		outs = append(outs, ioExit{counterRegPort, i}, ioExit{counterMemPort, i}, ioExit{counterXMMPort, i})
	}
	return outs
}

// newCounterVM creates a VM with an in-kernel irqchip (so the state has a
// LAPIC) and the counter guest's RAM in slot 0; the guest is loaded unless
// ram is given, whose contents are copied in instead.
func newCounterVM(t *testing.T, ram []byte) *testVM {
	t.Helper()
	v := newTestVM(t, (*kvm.VM).CreateIRQChip, memory.RegionSpec{Name: "ram", Size: counterRAM})
	if ram != nil {
		if err := v.mem.Write(0, ram); err != nil {
			t.Fatal(err)
		}
	} else if err := v.mem.Write(counterCodeAddr, counterGuest); err != nil {
		t.Fatal(err)
	}
	v.addSlot(t, 0, 0, 0)
	return v
}

// The counter guest counts at CPL3: under nested PVM only user-mode code
// runs natively, and KVM's instruction emulator, which runs CPL0 code
// there, knows no PADDQ. Its CPL0 prologue loads the TSS with LTR and
// drops to CPL3 with iretq, with IOPL 3. Its OUTs pass both ways an OUT
// at CPL3 can: PVM forces IOPL to 0 and checks the TSS's IO bitmap, which
// allows the guest's ports; QEMU's TCG (the emulated test host) accepts
// the bitmap only of a TR whose type is "available", while KVM saves TR as
// busy, so a restored vCPU there relies on IOPL 3.
const (
	userDataSelector = 0x1b
	userCodeSelector = 0x23
	tssSelector      = 0x28
	tssAddr          = 0x8000
	tssIOMapOffset   = 104 // right after the 64-bit TSS
	tssLimit         = tssIOMapOffset + 3 + 1 - 1
)

// writeUserTables writes a GDT (kernel code and data, user data and code,
// a 64-bit TSS) over vmm/boot's and a TSS whose IO bitmap allows ports 0
// to 23, and returns the GDTR.
func writeUserTables(t *testing.T, m *memory.Memory) kvm.DTable {
	t.Helper()
	desc := func(access, flags uint64, base, limit uint64) uint64 {
		return base&0xff000000<<32 | flags<<52 | limit&0xf0000<<32 | access<<40 | base&0xffffff<<16 | limit&0xffff
	}
	gdt := []uint64{
		0,
		desc(0x9b, 0xa, 0, 0xfffff),         // 0x08 kernel code, L
		desc(0x93, 0xc, 0, 0xfffff),         // 0x10 kernel data
		desc(0xf3, 0xc, 0, 0xfffff),         // 0x1b user data, DPL3
		desc(0xfb, 0xa, 0, 0xfffff),         // 0x23 user code, DPL3, L
		desc(0x89, 0, tssAddr, tssLimit), 0, // 0x28 available 64-bit TSS (two slots)
	}
	b := make([]byte, 8*len(gdt))
	for i, d := range gdt {
		binary.LittleEndian.PutUint64(b[8*i:], d)
	}
	if err := m.Write(boot.GDTAddr, b); err != nil {
		t.Fatal(err)
	}
	tss := make([]byte, tssLimit+1)
	binary.LittleEndian.PutUint16(tss[0x66:], tssIOMapOffset)
	tss[tssLimit] = 0xff // ports 24-31 denied; the bitmap's end
	if err := m.Write(tssAddr, tss); err != nil {
		t.Fatal(err)
	}
	return kvm.DTable{Base: uint64(boot.GDTAddr), Limit: uint16(len(b) - 1)}
}

// startLongMode sets cpu's CPUID to what KVM supports and its state to
// vmm/boot's 64-bit CPL0 state at entry, with the GDT of writeUserTables
// and SSE enabled.
func startLongMode(t *testing.T, v *testVM, cpu *kvm.VCPU, entry uint64) {
	t.Helper()
	st, err := boot.LongModeState(v.mem, entry)
	if err != nil {
		t.Fatal(err)
	}
	gdtr := writeUserTables(t, v.mem)
	cpuid, err := v.sys.SupportedCPUID()
	if err != nil {
		t.Fatal(err)
	}
	if err := cpu.SetCPUID2(cpuid); err != nil {
		t.Fatal(err)
	}
	sregs, err := cpu.Sregs()
	if err != nil {
		t.Fatal(err)
	}
	sregs.CS, sregs.DS, sregs.ES, sregs.FS = st.CS, st.DS, st.ES, st.FS
	sregs.GS, sregs.SS, sregs.TR, sregs.LDT = st.GS, st.SS, st.TR, st.LDT
	sregs.GDT, sregs.IDT = gdtr, kvm.DTable{}
	const cr4OSFXSR, cr4OSXMMEXCPT = 1 << 9, 1 << 10
	sregs.CR0, sregs.CR3, sregs.CR4, sregs.EFER = st.CR0, st.CR3, st.CR4|cr4OSFXSR|cr4OSXMMEXCPT, st.EFER
	if err := cpu.SetSregs(sregs); err != nil {
		t.Fatal(err)
	}
	if err := cpu.SetRegs(kvm.Regs{RIP: st.RIP, RSP: st.RSP, RFLAGS: st.RFLAGS}); err != nil {
		t.Fatal(err)
	}
}

func expectOuts(t *testing.T, cpu *kvm.VCPU, want []ioExit) {
	t.Helper()
	for i, w := range want {
		if got := runToOut(t, cpu); got != w {
			t.Fatalf("OUT %d = port %#x value %d, want port %#x value %d", i, got.port, got.value, w.port, w.value)
		}
	}
}

func TestRestoredVCPUContinuesWhereItStopped(t *testing.T) {
	lockThread(t)
	src := newCounterVM(t, nil)
	cpu, err := src.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	startLongMode(t, src, cpu, counterCodeAddr)
	// Three passes, then stop just after the first OUT of the fourth: its
	// completion is still pending in KVM, which SaveState must finish.
	expectOuts(t, cpu, append(counterOuts(1, 3), ioExit{counterRegPort, 4}))

	spec, err := src.vm.StateSpec()
	if err != nil {
		t.Fatal(err)
	}
	saved, err := cpu.SaveState(spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("saved %d CPUID leaves, %d MSRs of %d listed, XSAVE %d bytes, %d XCRs, LAPIC %v, TSC %d kHz, MP state %d",
		len(saved.CPUID), len(saved.MSRs), len(spec.MSRs), len(saved.XSAVE), len(saved.XCRs), saved.LAPIC != nil, saved.TSCKHz, saved.MP)
	checkSavedState(t, saved)

	// Send it through the wire encoding, as a migration would.
	wire, err := saved.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var received kvm.VCPUState
	if err := received.UnmarshalBinary(wire); err != nil {
		t.Fatal(err)
	}

	dst := newCounterVM(t, src.mem.Regions()[0].Bytes())
	dstCPU, err := dst.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	dstSpec, err := dst.vm.StateSpec()
	if err != nil {
		t.Fatal(err)
	}
	if err := dstCPU.RestoreState(&received, dstSpec); err != nil {
		t.Fatal(err)
	}
	// The rest of pass four, then two more.
	expectOuts(t, dstCPU, append([]ioExit{{counterMemPort, 4}, {counterXMMPort, 4}}, counterOuts(5, 6)...))

	// The restored vCPU's state reads back as what was restored, but for
	// what running it changed.
	again, err := dstCPU.SaveState(dstSpec)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := again.Sregs.EFER, saved.Sregs.EFER; got != want {
		t.Errorf("EFER after restore = %#x, want %#x", got, want)
	}
	if !bytes.Equal(again.LAPIC.Regs[:0x30], saved.LAPIC.Regs[:0x30]) {
		t.Errorf("LAPIC ID and version after restore differ from the saved ones")
	}
	if tsc, _ := again.MSR(kvm.MSRIA32TSC); tsc <= mustMSR(t, saved, kvm.MSRIA32TSC) {
		t.Errorf("TSC after restore and run = %d, not past the saved %d", tsc, mustMSR(t, saved, kvm.MSRIA32TSC))
	}
}

// checkSavedState checks what a 64-bit guest's state must hold.
func checkSavedState(t *testing.T, s *kvm.VCPUState) {
	t.Helper()
	if s.Regs.RBX != 4 {
		t.Errorf("saved RBX = %d, want 4", s.Regs.RBX)
	}
	if s.Sregs.EFER&boot.EFERLMA == 0 || s.Sregs.CS.L != 1 || s.Sregs.CS.DPL != 3 {
		t.Errorf("saved EFER %#x, CS.L %d, CS.DPL %d: not in 64-bit user mode", s.Sregs.EFER, s.Sregs.CS.L, s.Sregs.CS.DPL)
	}
	if s.FPU.XMM[0][0] != 4 {
		t.Errorf("saved XMM0 low byte = %d, want 4", s.FPU.XMM[0][0])
	}
	if tsc := mustMSR(t, s, kvm.MSRIA32TSC); tsc == 0 {
		t.Errorf("saved TSC is 0")
	}
	if s.LAPIC == nil {
		t.Errorf("no LAPIC saved from a VM with an in-kernel irqchip")
	}
	if len(s.CPUID) == 0 {
		t.Errorf("no CPUID saved from a vCPU given one")
	}
}

func mustMSR(t *testing.T, s *kvm.VCPUState, index uint32) uint64 {
	t.Helper()
	v, ok := s.MSR(index)
	if !ok {
		t.Fatalf("MSR %#x not saved", index)
	}
	return v
}
