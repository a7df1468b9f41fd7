package vmm

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"tern/vmm/devices"
	"tern/vmm/kvm"
)

// TestVMStateEntriesRoundTrip: the VM's own entries decode to what was
// encoded, in the layout vcpuStateKind's comment gives.
func TestVMStateEntriesRoundTrip(t *testing.T) {
	clk := clockState{RealtimeNs: 1234, HasKVM: true, KVM: kvm.ClockData{Clock: 99, Flags: kvm.ClockRealtime, Realtime: 5, HostTSC: 7}}
	p := clk.encode()
	if len(p) != clockStateSize {
		t.Fatalf("clock of %d bytes", len(p))
	}
	if got, err := decodeClockState(p); err != nil || got != clk {
		t.Fatalf("clock: %+v, %v; want %+v", got, err, clk)
	}
	st := &kvm.VCPUState{Regs: kvm.Regs{RIP: 0x100000, RSP: 0x7000}, MSRs: []kvm.MSREntry{{Index: kvm.MSRIA32TSC, Data: 42}}}
	b, err := st.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	id, got, err := decodeVCPUState(append([]byte{3, 0, 0, 0}, b...))
	if err != nil || id != 3 || !reflect.DeepEqual(got.Regs, st.Regs) {
		t.Fatalf("vcpu: %d, %+v, %v", id, got, err)
	}
	chip := append([]byte{kvm.IRQChipIOAPIC, 0, 0, 0}, make([]byte, 512)...)
	chip[4+24] = 0x34
	if c, err := decodeIRQChipState(chip); err != nil || c.ChipID != kvm.IRQChipIOAPIC || c.Chip[24] != 0x34 {
		t.Fatalf("irqchip: %+v, %v", c.ChipID, err)
	}
}

// TestMalformedVMStateIsRefused: an irqchip past the IOAPIC, payloads of
// the wrong size, an unknown kind or version.
func TestMalformedVMStateIsRefused(t *testing.T) {
	s := &savedVM{cpus: map[uint32]*kvm.VCPUState{}}
	for _, c := range []struct {
		e    DeviceState
		want error
	}{
		{DeviceState{Kind: irqChipStateKind, Version: 1, Payload: append([]byte{3, 0, 0, 0}, make([]byte, 512)...)}, devices.ErrMalformedState},
		{DeviceState{Kind: irqChipStateKind, Version: 1, Payload: make([]byte, 100)}, devices.ErrMalformedState},
		{DeviceState{Kind: pitStateKind, Version: 1, Payload: make([]byte, 113)}, devices.ErrMalformedState},
		{DeviceState{Kind: clockStateKind, Version: 1}, devices.ErrMalformedState},
		{DeviceState{Kind: vcpuStateKind, Version: 1, Payload: []byte{0, 0}}, devices.ErrMalformedState},
		{DeviceState{Kind: "gpu", Version: 1}, devices.ErrUnknownState},
		{DeviceState{Kind: clockStateKind, Version: 0}, devices.ErrUnknownState},
		{DeviceState{Kind: clockStateKind, Version: 2}, devices.ErrUnknownState},
	} {
		if err := s.readOwn(c.e, 1); !errors.Is(err, c.want) {
			t.Errorf("%s version %d of %d bytes: %v, want %v", c.e.Kind, c.e.Version, len(c.e.Payload), err, c.want)
		}
	}
}

func TestAdvanceTSCMovesTheTSCByTheElapsedTime(t *testing.T) {
	st := &kvm.VCPUState{TSCKHz: 2_000_000, MSRs: []kvm.MSREntry{{Index: 0x1b, Data: 7}, {Index: kvm.MSRIA32TSC, Data: 1000}}}
	advanceTSC(st, int64(3*time.Millisecond))
	if tsc, _ := st.MSR(kvm.MSRIA32TSC); tsc != 1000+6_000_000 {
		t.Fatalf("TSC %d", tsc)
	}
	if v, _ := st.MSR(0x1b); v != 7 {
		t.Fatalf("another MSR changed: %d", v)
	}
}

// FuzzReadVMState feeds arbitrary entries of the VM's own kinds to the
// code that reads them off the network: each may be refused, none may
// panic.
func FuzzReadVMState(f *testing.F) {
	kinds := []string{vcpuStateKind, clockStateKind, irqChipStateKind, pitStateKind, "gpu"}
	st, err := (&kvm.VCPUState{Regs: kvm.Regs{RIP: 1}}).MarshalBinary()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), uint16(1), append([]byte{0, 0, 0, 0}, st...))
	f.Add(uint8(1), uint16(1), clockState{HasKVM: true}.encode())
	f.Add(uint8(2), uint16(1), append([]byte{2, 0, 0, 0}, make([]byte, 512)...))
	f.Add(uint8(3), uint16(1), make([]byte, pitStateSize))
	slots := statefulSet{kind: devices.UARTStateKind, slotted: true, devs: []devices.Stateful{
		devices.NewUART(devices.NewHistory(64), devices.NoInterrupt{}), devices.NewUART(devices.NewHistory(64), devices.NoInterrupt{})}}
	f.Fuzz(func(t *testing.T, kind uint8, version uint16, payload []byte) {
		e := DeviceState{Kind: kinds[int(kind)%len(kinds)], Version: version, Payload: payload}
		s := &savedVM{cpus: map[uint32]*kvm.VCPUState{}}
		s.readOwn(e, 2)
		// A slotted device's entry: its slot, then the device's bytes
		// (FuzzRestoreState in vmm/devices fuzzes those).
		e.Kind = devices.UARTStateKind
		slots.entry(e, map[uint16]bool{})
	})
}
