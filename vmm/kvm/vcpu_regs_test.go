package kvm_test

import (
	"errors"
	"slices"
	"testing"

	"tern/vmm/kvm"
	"tern/vmm/memory"
)

// newIdleVCPU returns a vCPU of a new VM (with an in-kernel irqchip) that
// never runs.
func newIdleVCPU(t testing.TB) (*testVM, *kvm.VCPU) {
	t.Helper()
	v := newTestVM(t, (*kvm.VM).CreateIRQChip, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	return v, cpu
}

func TestXSAVERoundTrips(t *testing.T) {
	v, cpu := newIdleVCPU(t)
	size, err := v.vm.XSAVESize()
	if errors.Is(err, kvm.ErrNotSupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	area, err := cpu.XSAVE(v.vm)
	if err != nil {
		t.Fatal(err)
	}
	if len(area) != size {
		t.Fatalf("XSAVE area of %d bytes, want XSAVESize %d", len(area), size)
	}
	// XMM0 is at byte 160 of the legacy region; XSTATE_BV (byte 512) must
	// say the SSE state is in use, or KVM takes the registers as zero.
	const xmm0, xstateBV, sseInUse = 160, 512, 1 << 1
	area[xstateBV] |= sseInUse
	area[xmm0] = 0x77
	if err := cpu.SetXSAVE(v.vm, area); err != nil {
		t.Fatal(err)
	}
	fpu, err := cpu.FPU()
	if err != nil {
		t.Fatal(err)
	}
	if fpu.XMM[0][0] != 0x77 {
		t.Errorf("XMM0's low byte %#x after SetXSAVE, want 0x77", fpu.XMM[0][0])
	}
	if err := cpu.SetXSAVE(v.vm, append(area, make([]byte, 4096)...)); err == nil {
		t.Error("SetXSAVE of an area bigger than the host's succeeded")
	}
}

func TestRegisterSettersReadBack(t *testing.T) {
	_, cpu := newIdleVCPU(t)
	fpu, err := cpu.FPU()
	if err != nil {
		t.Fatal(err)
	}
	fpu.XMM[7][3], fpu.FCW = 0x5a, 0x27f
	if err := cpu.SetFPU(fpu); err != nil {
		t.Fatal(err)
	}
	if got, err := cpu.FPU(); err != nil || got.XMM[7][3] != 0x5a || got.FCW != 0x27f {
		t.Errorf("FPU after SetFPU: XMM7[3] %#x FCW %#x (%v), want 0x5a 0x27f", got.XMM[7][3], got.FCW, err)
	}

	const tscAux = 0xc0000103 // MSR_TSC_AUX: plain storage
	if err := cpu.SetMSRs([]kvm.MSREntry{{Index: kvm.MSRIA32TSC, Data: 1 << 40}, {Index: tscAux, Data: 7}}); err != nil {
		t.Fatal(err)
	}
	got, err := cpu.MSRs([]uint32{kvm.MSRIA32TSC, tscAux})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Data < 1<<40 || got[1].Data != 7 {
		t.Errorf("MSRs after SetMSRs = %+v, want TSC from 1<<40 and TSC_AUX 7", got)
	}
	// An MSR no CPU has stops KVM_GET_MSRS there.
	if got, err := cpu.MSRs([]uint32{tscAux, 0xdead0000, kvm.MSRIA32TSC}); err != nil || len(got) != 1 {
		t.Errorf("MSRs with a bogus index second = %+v, %v; want only the first", got, err)
	}
	if err := cpu.SetMSRs([]kvm.MSREntry{{Index: 0xdead0000}}); err == nil {
		t.Error("SetMSRs of a bogus MSR succeeded")
	}

	if err := cpu.SetMPState(kvm.MPStateRunnable); err != nil {
		t.Fatal(err)
	}
	if mp, err := cpu.MPState(); err != nil || mp != kvm.MPStateRunnable {
		t.Errorf("MP state = %d, %v; want runnable", mp, err)
	}
	ev, err := cpu.VCPUEvents()
	if err != nil {
		t.Fatal(err)
	}
	ev.NMI.Masked = 1
	if err := cpu.SetVCPUEvents(ev); err != nil {
		t.Fatal(err)
	}
	if got, err := cpu.VCPUEvents(); err != nil || got.NMI.Masked != 1 {
		t.Errorf("NMI masked after SetVCPUEvents = %d, %v; want 1", got.NMI.Masked, err)
	}
	xcrs, err := cpu.XCRs()
	if errors.Is(err, kvm.ErrNotSupported) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := cpu.SetXCRs(xcrs); err != nil {
		t.Fatal(err)
	}
}

func TestMSRIndexListHasTheTSC(t *testing.T) {
	v, _ := newIdleVCPU(t)
	list, err := v.sys.MSRIndexList()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(list, kvm.MSRIA32TSC) {
		t.Errorf("MSR index list (%d entries) lacks IA32_TSC", len(list))
	}
}

func TestRestoreStateRefusesAnXSAVEAreaTooBigForTheHost(t *testing.T) {
	v, cpu := newIdleVCPU(t)
	spec, err := v.vm.StateSpec()
	if err != nil {
		t.Fatal(err)
	}
	if spec.XSAVESize == 0 {
		t.Skip("no XSAVE on this host")
	}
	s, err := cpu.SaveState(spec)
	if err != nil {
		t.Fatal(err)
	}
	s.XSAVE = append(s.XSAVE, make([]byte, 4096)...) // from a host with more XSAVE features
	_, fresh := newIdleVCPU(t)
	if err := fresh.RestoreState(s, spec); err == nil {
		t.Fatal("RestoreState of an XSAVE area bigger than the host's succeeded")
	}
}

func TestSaveStateCarriesPATMTRRsAndDebugRegisters(t *testing.T) {
	const pat, mtrrDefType, mtrrPhysBase0 = 0x277, 0x2ff, 0x200
	set := []kvm.MSREntry{
		{Index: pat, Data: 0x0606060606060606}, // all write-back
		{Index: mtrrDefType, Data: 0xc06},      // MTRRs and fixed MTRRs on, default WB
		{Index: mtrrPhysBase0, Data: 0x80000000},
	}
	v, cpu := newIdleVCPU(t)
	if err := cpu.SetMSRs(set); err != nil {
		t.Fatal(err)
	}
	dr := kvm.DebugRegs{DB: [4]uint64{0x1234, 0, 0, 0x5678}, DR6: 0xffff0ff0, DR7: 0x400} // no breakpoint enabled
	if err := cpu.SetDebugRegs(dr); err != nil {
		t.Fatal(err)
	}
	spec, err := v.vm.StateSpec()
	if err != nil {
		t.Fatal(err)
	}
	s, err := cpu.SaveState(spec)
	if err != nil {
		t.Fatal(err)
	}
	dv, fresh := newIdleVCPU(t)
	dspec, err := dv.vm.StateSpec()
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.RestoreState(s, dspec); err != nil {
		t.Fatal(err)
	}
	got, err := fresh.MSRs([]uint32{pat, mtrrDefType, mtrrPhysBase0})
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range got {
		if e.Data != set[i].Data {
			t.Errorf("MSR %#x after restore = %#x, want %#x", e.Index, e.Data, set[i].Data)
		}
	}
	if len(got) != len(set) {
		t.Errorf("read %d of %d MSRs after restore", len(got), len(set))
	}
	gotDR, err := fresh.DebugRegs()
	if err != nil {
		t.Fatal(err)
	}
	if gotDR.DB != dr.DB || gotDR.DR7 != dr.DR7 {
		t.Errorf("debug registers after restore = %+v, want %+v", gotDR, dr)
	}
}

func TestCompletePendingIOFinishesTheOUTAndRunsNothingMore(t *testing.T) {
	v := newTestVM(t, nil, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
	guest := []byte{0xe6, roundDonePort, 0xf4} // out roundDonePort, al; hlt
	if err := v.mem.Write(0, guest); err != nil {
		t.Fatal(err)
	}
	v.addSlot(t, 0, 0, 0)
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := kvm.StartRealMode(cpu, 0); err != nil {
		t.Fatal(err)
	}
	runToOut(t, cpu)
	before, err := cpu.Regs()
	if err != nil {
		t.Fatal(err)
	}
	for range 2 { // a second call finds nothing pending and runs nothing
		if err := cpu.CompletePendingIO(); err != nil {
			t.Fatal(err)
		}
		regs, err := cpu.Regs()
		if err != nil {
			t.Fatal(err)
		}
		if regs.RIP != 2 {
			t.Fatalf("RIP %#x after CompletePendingIO (%#x before), want 2: just past the OUT, before the HLT", regs.RIP, before.RIP)
		}
	}
	t.Logf("RIP at the OUT exit %#x, after CompletePendingIO 2", before.RIP)
	runToHLT(t, cpu)
}

// BenchmarkSaveStateAndEncode measures what stopping a vCPU for migration
// costs in state: SaveState and MarshalBinary, then decoding and
// RestoreState on a second vCPU.
func BenchmarkSaveStateAndEncode(b *testing.B) {
	v, cpu := newIdleVCPU(b)
	spec, err := v.vm.StateSpec()
	if err != nil {
		b.Fatal(err)
	}
	_, target := newIdleVCPU(b)
	b.ReportAllocs()
	var size int
	for b.Loop() {
		s, err := cpu.SaveState(spec)
		if err != nil {
			b.Fatal(err)
		}
		wire, err := s.MarshalBinary()
		if err != nil {
			b.Fatal(err)
		}
		size = len(wire)
		var got kvm.VCPUState
		if err := got.UnmarshalBinary(wire); err != nil {
			b.Fatal(err)
		}
		if err := target.RestoreState(&got, spec); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(size), "bytes/state")
}

// TestRestoreStateSetsATSCWithinASecondOfAFreshVMs restores a TSC 200 ms
// ahead of a fresh vCPU's: a KVM before Linux 6.10 (the emulated test
// host's 6.1) takes such a write as a synchronisation and keeps its own
// TSC, so a guest migrated soon after it started saw its clock jump back.
func TestRestoreStateSetsATSCWithinASecondOfAFreshVMs(t *testing.T) {
	v, cpu := newIdleVCPU(t)
	spec, err := v.vm.StateSpec()
	if err != nil {
		t.Fatal(err)
	}
	s, err := cpu.SaveState(spec)
	if err != nil {
		t.Fatal(err)
	}
	khz := uint64(s.TSCKHz)
	if khz == 0 {
		t.Skip("the host does not say its TSC frequency")
	}
	readTSC := func() uint64 {
		t.Helper()
		got, err := cpu.MSRs([]uint32{kvm.MSRIA32TSC})
		if err != nil || len(got) != 1 {
			t.Fatalf("reading the TSC: %v, %d MSRs", err, len(got))
		}
		return got[0].Data
	}
	// A write far from what KVM expects is never matched; where even it
	// does not take, this KVM keeps guests on the host's TSC (nested PVM).
	far := readTSC() + 1<<40
	if err := cpu.SetMSRs([]kvm.MSREntry{{Index: kvm.MSRIA32TSC, Data: far}}); err != nil {
		t.Fatal(err)
	}
	if got := readTSC(); got < far || got-far > 100*khz {
		t.Skipf("this KVM ignores a written TSC (wrote %d, reads %d): its guests run on the host's TSC", far, got)
	}
	want := readTSC() + 200*khz // 200 ms on
	for i := range s.MSRs {
		if s.MSRs[i].Index == kvm.MSRIA32TSC {
			s.MSRs[i].Data = want
		}
	}
	if err := cpu.RestoreState(s, spec); err != nil {
		t.Fatal(err)
	}
	if got := readTSC(); got < want || got-want > 100*khz {
		t.Errorf("TSC after restoring %d = %d (%+.1f ms off), want it at most 100 ms past", want, got, float64(int64(got-want))/float64(khz))
	}
	off, err := cpu.TSCOffset()
	if errors.Is(err, kvm.ErrNotSupported) {
		t.Logf("no TSC offset attribute: %v", err)
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := cpu.SetTSCOffset(off); err != nil {
		t.Fatalf("setting the offset just read: %v", err)
	}
}
