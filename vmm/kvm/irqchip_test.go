package kvm_test

import (
	"encoding/binary"
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

// TestIRQChipAndPITStateMoveToAnotherVM: the IOAPIC's redirection
// entry and a PIT channel's count and mode set on one VM read back from
// another loaded with its state (what a live migration does), and a chip
// ID KVM has not is an error.
func TestIRQChipAndPITStateMoveToAnotherVM(t *testing.T) {
	newVM := func() *kvm.VM {
		v := newTestVM(t, (*kvm.VM).CreateIRQChip, memory.RegionSpec{Name: "ram", Size: memory.PageSize})
		if err := v.vm.CreatePIT2(0); err != nil {
			t.Fatal(err)
		}
		return v.vm
	}
	src, dst := newVM(), newVM()
	const redirEntry4 = 24 + 4*8 // kvm_ioapic_state: base, ioregsel, id, irr, pad, then redirtbl[24]
	io, err := src.IRQChip(kvm.IRQChipIOAPIC)
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint64(io.Chip[redirEntry4:], 0x34) // vector 0x34, unmasked, edge, fixed
	if err := src.SetIRQChip(io); err != nil {
		t.Fatal(err)
	}
	pit, err := src.PIT()
	if err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(pit.State[0:], 0x1234) // channel 0's count
	pit.State[12], pit.State[13] = 3, 2                  // rw_mode lsb-then-msb, mode 2 (rate generator)
	if err := src.SetPIT(pit); err != nil {
		t.Fatal(err)
	}
	for _, chip := range []uint32{kvm.IRQChipPICMaster, kvm.IRQChipPICSlave, kvm.IRQChipIOAPIC} {
		st, err := src.IRQChip(chip)
		if err != nil {
			t.Fatal(err)
		}
		if err := dst.SetIRQChip(st); err != nil {
			t.Fatal(err)
		}
		back, err := dst.IRQChip(chip)
		if err != nil {
			t.Fatal(err)
		}
		if back != st {
			t.Errorf("irqchip %d reads back differently on the second VM", chip)
		}
	}
	if got, err := dst.IRQChip(kvm.IRQChipIOAPIC); err != nil || binary.LittleEndian.Uint64(got.Chip[redirEntry4:]) != 0x34 {
		t.Errorf("IOAPIC pin 4 on the second VM: %#x, %v; want 0x34", binary.LittleEndian.Uint64(got.Chip[redirEntry4:]), err)
	}
	saved, err := src.PIT()
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.SetPIT(saved); err != nil {
		t.Fatal(err)
	}
	got, err := dst.PIT()
	if err != nil {
		t.Fatal(err)
	}
	if c, m := binary.LittleEndian.Uint32(got.State[0:]), got.State[13]; c != 0x1234 || m != 2 {
		t.Errorf("PIT channel 0 on the second VM: count %#x mode %d, want 0x1234 and 2", c, m)
	}
	if _, err := dst.IRQChip(7); err == nil {
		t.Error("irqchip 7: no error")
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
