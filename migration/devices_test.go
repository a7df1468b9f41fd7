package migration

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"tern/vmm/devices"
	"tern/vmm/kvm"
)

// uartV2 is a next version of the UART payload, as a later tern would
// define it: version 1's fields, then a FIFO trigger level.
type uartV2 struct {
	devices.UARTState
	TriggerLevel uint8
}

func decodeUARTv2(version uint16, p []byte) (any, error) {
	s, d := decodeUARTv1(p)
	v := uartV2{UARTState: s}
	if version == 2 {
		v.TriggerLevel = d.u8()
	}
	return v, d.finish(msgDevices)
}

func TestTheNextVersionOfAPayloadStillReadsTheCurrentOne(t *testing.T) {
	next := registry{kindUART: {2, decodeUARTv2}}
	cur := devices.UARTState{IER: 1, LCR: 3, MCR: 3, SCR: 0x5a, DLL: 1, FIFO: true, Input: []byte("ab")}
	ds := encodeUART(cur) // what this tern sends: version 1
	got, err := next.decode(ds)
	if err != nil {
		t.Fatalf("version 2 reading version 1: %v", err)
	}
	if want := (uartV2{UARTState: cur}); !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	v2 := DeviceState{Kind: kindUART, Version: 2, Payload: append(append([]byte(nil), ds.Payload...), 14)}
	got, err = next.decode(v2)
	if err != nil || got.(uartV2).TriggerLevel != 14 {
		t.Fatalf("version 2 reading version 2: %+v, %v", got, err)
	}
	// This tern reads version 1 and refuses the later one cleanly.
	if _, err := currentDevices.decode(v2); !errors.Is(err, ErrUnknownDevice) {
		t.Fatalf("version 1 reading version 2: %v, want ErrUnknownDevice", err)
	}
	// Two versions back is not read.
	if _, err := (registry{kindUART: {3, decodeUARTv2}}).decode(ds); !errors.Is(err, ErrUnknownDevice) {
		t.Fatalf("version 3 reading version 1: %v, want ErrUnknownDevice", err)
	}
}

func TestUnknownDeviceKindOrVersionIsAnError(t *testing.T) {
	for _, ds := range []DeviceState{
		{Kind: "gpu", Version: 1},
		{Kind: kindClock, Version: 0},
		{Kind: kindClock, Version: 2},
	} {
		if _, err := currentDevices.decode(ds); !errors.Is(err, ErrUnknownDevice) {
			t.Errorf("decode(%+v) = %v, want ErrUnknownDevice", ds, err)
		}
	}
}

var virtioSample = virtioBlkState{Slot: 2, State: devices.VirtioMMIOState{Status: 15, QueueSel: 0, DriverFeatures: 1<<32 | 1<<9,
	InterruptStatus: 1, Queues: []devices.VirtioQueueState{{Num: 128, Ready: true, Desc: 0x10000, Driver: 0x11000, Device: 0x12000}}}}

var (
	chipSample = kvm.IRQChipState{ChipID: kvm.IRQChipIOAPIC, Chip: [512]byte{0: 0xfe, 24: 0x34, 511: 1}}
	pitSample  = kvm.PITState{State: [112]byte{0: 0x34, 1: 0x12, 13: 2, 111: 9}}
)

// TestPlatformPayloadsRefuseWhatKVMCannotTake: an irqchip ID past the
// IOAPIC's and payloads of the wrong size are malformed.
func TestPlatformPayloadsRefuseWhatKVMCannotTake(t *testing.T) {
	bad := encodeIRQChip(kvm.IRQChipState{ChipID: 3})
	short := encodeIRQChip(chipSample)
	short.Payload = short.Payload[:100]
	long := encodePIT(pitSample)
	long.Payload = append(long.Payload, 0)
	for _, ds := range []DeviceState{bad, short, long, {Kind: kindPIT, Version: 1}} {
		if _, err := currentDevices.decode(ds); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s of %d bytes: %v, want ErrMalformed", ds.Kind, len(ds.Payload), err)
		}
	}
}

func TestEveryDevicePayloadRoundTrips(t *testing.T) {
	st := &kvm.VCPUState{Regs: kvm.Regs{RIP: 0x100000, RSP: 0x7000}, MSRs: []kvm.MSREntry{{Index: kvm.MSRIA32TSC, Data: 42}}}
	vds, err := encodeVCPU(vcpuState{ID: 3, State: st})
	if err != nil {
		t.Fatal(err)
	}
	clk := clockState{RealtimeNs: 1234, HasKVM: true, KVM: kvm.ClockData{Clock: 99, Flags: kvm.ClockRealtime, Realtime: 5}}
	cases := []struct {
		ds   DeviceState
		want any
	}{
		{encodeClock(clk), clk},
		{encodeUART(devices.UARTState{LCR: 3, Input: []byte("x")}), devices.UARTState{LCR: 3, Input: []byte("x")}},
		{encodeHistory(devices.HistoryState{End: 10, Data: []byte("hello")}), devices.HistoryState{End: 10, Data: []byte("hello")}},
		{encodeBootTimer(devices.BootTimerState{Done: true, Elapsed: time.Second}), devices.BootTimerState{Done: true, Elapsed: time.Second}},
		{encodeVirtioBlk(virtioSample), virtioSample},
		{encodeVirtioNet(virtioNetState{Card: 1, State: virtioSample.State}), virtioNetState{Card: 1, State: virtioSample.State}},
		{encodeIRQChip(chipSample), irqChipState{chipSample}},
		{encodePIT(pitSample), pitState{pitSample}},
	}
	for _, c := range cases {
		got, err := currentDevices.decode(c.ds)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: got %+v, %v; want %+v", c.ds.Kind, got, err, c.want)
		}
	}
	got, err := currentDevices.decode(vds)
	if err != nil {
		t.Fatal(err)
	}
	if v := got.(vcpuState); v.ID != 3 || v.State.Regs.RIP != 0x100000 {
		t.Fatalf("vcpu: %+v", v)
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

func FuzzDecodeDeviceState(f *testing.F) {
	st := &kvm.VCPUState{Regs: kvm.Regs{RIP: 1}}
	v, err := encodeVCPU(vcpuState{ID: 0, State: st})
	if err != nil {
		f.Fatal(err)
	}
	kinds := []string{kindVCPU, kindClock, kindUART, kindHistory, kindBootTimer, kindVirtioBlk, kindVirtioNet, kindIRQChip, kindPIT, "gpu"}
	for i, ds := range []DeviceState{v, encodeClock(clockState{}), encodeUART(devices.UARTState{Input: []byte("q")}),
		encodeHistory(devices.HistoryState{End: 3, Data: []byte("abc")}), encodeBootTimer(devices.BootTimerState{}),
		encodeVirtioBlk(virtioSample), encodeVirtioNet(virtioNetState{State: virtioSample.State}),
		encodeIRQChip(chipSample), encodePIT(pitSample)} {
		f.Add(uint8(i), ds.Version, ds.Payload)
	}
	f.Fuzz(func(t *testing.T, kind uint8, version uint16, payload []byte) {
		ds := DeviceState{Kind: kinds[int(kind)%len(kinds)], Version: version, Payload: payload}
		currentDevices.decode(ds) // must not panic
	})
}
