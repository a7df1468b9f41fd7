package kvm_test

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	"tern/vmm/kvm"
	"tern/vmm/memory"
)

func TestIRQChipPITLineAndIRQFD(t *testing.T) {
	v := newTestVM(t, (*kvm.VM).CreateIRQChip, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
	if err := v.vm.CreatePIT2(0); err != nil {
		t.Fatal(err)
	}
	for _, high := range []bool{true, false} {
		if err := v.vm.IRQLine(4, high); err != nil {
			t.Fatal(err)
		}
	}
	efd := newEventFD(t)
	if err := v.vm.AssignIRQFD(efd, 5); err != nil {
		t.Fatal(err)
	}
	// KVM consumes the eventfd's count to raise GSI 5.
	if _, err := unix.Write(efd, []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if err := v.vm.DeassignIRQFD(efd, 5); err != nil {
		t.Fatal(err)
	}
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cpu.LAPIC(); err != nil {
		t.Errorf("LAPIC with an in-kernel irqchip: %v", err)
	}
}

// ioeventGuest is real-mode code that writes 0x41, then 0x42 to
// ioeventPort, then OUTs to roundDonePort and halts.
var ioeventGuest = []byte{
	0xba, ioeventPort & 0xff, ioeventPort >> 8, // mov dx, ioeventPort
	0xb0, 0x41, 0xee, // mov al, 0x41; out dx, al
	0xb0, 0x42, 0xee, // mov al, 0x42; out dx, al
	0xe6, roundDonePort, // out roundDonePort, al
	0xf4, // hlt
}

const ioeventPort = 0x510

func TestIOEventFDFiresOnTheGuestsMatchingWrite(t *testing.T) {
	v := newTestVM(t, nil, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
	if err := v.mem.Write(0, ioeventGuest); err != nil {
		t.Fatal(err)
	}
	v.addSlot(t, 0, 0, 0)
	efd := newEventFD(t)
	match := uint64(0x42)
	ev := kvm.IOEventFD{Addr: ioeventPort, Len: 1, PIO: true, Datamatch: &match, FD: efd}
	if err := v.vm.AssignIOEventFD(ev); err != nil {
		t.Fatal(err)
	}
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if err := kvm.StartRealMode(cpu, 0); err != nil {
		t.Fatal(err)
	}
	// 0x41 does not match: an ordinary exit, and no signal.
	if out := runToOut(t, cpu); out != (ioExit{ioeventPort, 0x41}) {
		t.Fatalf("first exit = %+v, want the unmatched OUT of 0x41 to %#x", out, ioeventPort)
	}
	if n := eventCount(t, efd); n != 0 {
		t.Fatalf("eventfd count %d after the unmatched write, want 0", n)
	}
	// 0x42 matches: KVM signals the eventfd in the guest's OUT, without an
	// exit, so it has fired by the time the next OUT exits.
	if out := runToOut(t, cpu); out.port != roundDonePort {
		t.Fatalf("second exit = %+v, want the OUT to %#x (the matched write must not exit)", out, roundDonePort)
	}
	if n := eventCount(t, efd); n != 1 {
		t.Fatalf("eventfd count %d after the matched write, want 1", n)
	}
	runToHLT(t, cpu)
	if err := v.vm.DeassignIOEventFD(ev); err != nil {
		t.Fatal(err)
	}
}

// bogusCap is a capability number no KVM has.
const bogusCap kvm.Capability = 0x7fff0000

func TestMissingCapabilityIsErrNotSupported(t *testing.T) {
	v := newTestVM(t, nil, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"System.RequireExtension", v.sys.RequireExtension(bogusCap)},
		{"VM.EnableCap", v.vm.EnableCap(bogusCap, 1)},
		{"VCPU.EnableCap", cpu.EnableCap(bogusCap)},
	} {
		if !errors.Is(c.err, kvm.ErrNotSupported) {
			t.Errorf("%s(%v) = %v, want ErrNotSupported", c.name, bogusCap, c.err)
		}
		t.Logf("%s: %v", c.name, c.err)
	}
	var ce *kvm.CapabilityError
	if err := v.vm.EnableCap(bogusCap); !errors.As(err, &ce) || ce.Cap != bogusCap {
		t.Errorf("VM.EnableCap = %v, want a *CapabilityError for %v", err, bogusCap)
	}
}

func TestLAPICWithoutIRQChipIsErrNoIRQChip(t *testing.T) {
	v := newTestVM(t, nil, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cpu.LAPIC(); !errors.Is(err, kvm.ErrNoIRQChip) {
		t.Fatalf("LAPIC without irqchip = %v, want ErrNoIRQChip", err)
	}
}

func TestClockAndTSCFrequency(t *testing.T) {
	v := newTestVM(t, nil, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
	c, err := v.vm.Clock()
	if errors.Is(err, kvm.ErrNotSupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	const ahead = uint64(5e9) // ns
	c.Clock += ahead
	if err := v.vm.SetClock(c); err != nil {
		t.Fatal(err)
	}
	c2, err := v.vm.Clock()
	if err != nil {
		t.Fatal(err)
	}
	if c2.Clock < c.Clock {
		t.Errorf("clock after SetClock(%d) = %d, went back", c.Clock, c2.Clock)
	}
	lockThread(t)
	cpu, err := v.vm.CreateVCPU(0)
	if err != nil {
		t.Fatal(err)
	}
	khz, err := cpu.TSCKHz()
	if errors.Is(err, kvm.ErrNotSupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if khz == 0 {
		t.Fatal("TSC frequency 0 kHz")
	}
	// Setting the frequency it already has needs no TSC scaling.
	if err := cpu.SetTSCKHz(khz); err != nil {
		t.Fatal(err)
	}
}
