package migration

import (
	"fmt"
	"time"

	"tern/vmm/devices"
	"tern/vmm/kvm"
)

// Device kinds and their current payload versions. Each decoder reads its
// version and the one before it (when there is one), so a tern one
// version behind can still send to this one.
const (
	kindVCPU      = "vcpu"
	kindClock     = "clock"
	kindUART      = "uart"
	kindHistory   = "serial-history"
	kindBootTimer = "boot-timer"
	kindVirtioBlk = "virtio-blk"
)

// maxVirtioQueues bounds a virtio-blk payload's queues.
const maxVirtioQueues = 64

// vcpuState is a vCPU's id and state.
type vcpuState struct {
	ID    uint32
	State *kvm.VCPUState
}

// clockState is the source's time at capture: host realtime, and the
// kvmclock when KVM has one.
type clockState struct {
	RealtimeNs int64
	HasKVM     bool
	KVM        kvm.ClockData
}

// deviceCodec reads one kind's payloads.
type deviceCodec struct {
	// version is the current version; decode accepts it and version-1.
	version uint16
	decode  func(version uint16, p []byte) (any, error)
}

// registry maps kinds to codecs.
type registry map[string]deviceCodec

// currentDevices is what this tern reads.
var currentDevices = registry{
	kindVCPU:      {1, decodeVCPU},
	kindClock:     {1, decodeClock},
	kindUART:      {1, decodeUART},
	kindHistory:   {1, decodeHistory},
	kindBootTimer: {1, decodeBootTimer},
	kindVirtioBlk: {1, decodeVirtioBlk},
	kindVirtioNet: {1, decodeVirtioNet},
	kindIRQChip:   {1, decodeIRQChip},
	kindPIT:       {1, decodePIT},
}

// decode reads ds; an unknown kind or a version other than the codec's
// own or the one before is ErrUnknownDevice.
func (r registry) decode(ds DeviceState) (any, error) {
	c, ok := r[ds.Kind]
	if !ok {
		return nil, fmt.Errorf("decoding device state: %w: kind %q", ErrUnknownDevice, ds.Kind)
	}
	if ds.Version != c.version && (ds.Version+1 != c.version || ds.Version == 0) {
		return nil, fmt.Errorf("decoding device state: %w: %s version %d (this tern reads %d and %d)",
			ErrUnknownDevice, ds.Kind, ds.Version, c.version-1, c.version)
	}
	v, err := c.decode(ds.Version, ds.Payload)
	if err != nil {
		return nil, fmt.Errorf("decoding %s state version %d: %w", ds.Kind, ds.Version, err)
	}
	return v, nil
}

func encodeVCPU(v vcpuState) (DeviceState, error) {
	b, err := v.State.MarshalBinary()
	if err != nil {
		return DeviceState{}, err
	}
	e := &encoder{}
	e.u32(v.ID)
	e.b = append(e.b, b...)
	return DeviceState{Kind: kindVCPU, Version: 1, Payload: e.b}, nil
}

func decodeVCPU(_ uint16, p []byte) (any, error) {
	d := &decoder{b: p}
	id := d.u32()
	if d.err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, d.err)
	}
	st := &kvm.VCPUState{}
	if err := st.UnmarshalBinary(d.b); err != nil {
		return nil, err
	}
	return vcpuState{ID: id, State: st}, nil
}

func encodeClock(c clockState) DeviceState {
	e := &encoder{}
	e.u64(uint64(c.RealtimeNs))
	e.u8(boolByte(c.HasKVM))
	e.u64(c.KVM.Clock)
	e.u32(c.KVM.Flags)
	e.u64(c.KVM.Realtime)
	e.u64(c.KVM.HostTSC)
	return DeviceState{Kind: kindClock, Version: 1, Payload: e.b}
}

func decodeClock(_ uint16, p []byte) (any, error) {
	d := &decoder{b: p}
	c := clockState{RealtimeNs: int64(d.u64()), HasKVM: d.u8() != 0}
	c.KVM.Clock, c.KVM.Flags, c.KVM.Realtime, c.KVM.HostTSC = d.u64(), d.u32(), d.u64(), d.u64()
	return c, d.finish(msgDevices)
}

func encodeUART(s devices.UARTState) DeviceState {
	e := &encoder{}
	for _, v := range []uint8{s.IER, s.LCR, s.MCR, s.SCR, s.DLL, s.DLM, boolByte(s.FIFO), boolByte(s.THREPending)} {
		e.u8(v)
	}
	e.bytes32(s.Input)
	return DeviceState{Kind: kindUART, Version: 1, Payload: e.b}
}

// decodeUARTv1 reads a version 1 UART payload and returns what follows.
func decodeUARTv1(p []byte) (devices.UARTState, *decoder) {
	d := &decoder{b: p}
	var s devices.UARTState
	s.IER, s.LCR, s.MCR, s.SCR, s.DLL, s.DLM = d.u8(), d.u8(), d.u8(), d.u8(), d.u8(), d.u8()
	s.FIFO, s.THREPending = d.u8() != 0, d.u8() != 0
	s.Input = d.bytes32(64 << 10)
	return s, d
}

func decodeUART(_ uint16, p []byte) (any, error) {
	s, d := decodeUARTv1(p)
	return s, d.finish(msgDevices)
}

func encodeHistory(s devices.HistoryState) DeviceState {
	e := &encoder{}
	e.u64(s.End)
	e.bytes32(s.Data)
	return DeviceState{Kind: kindHistory, Version: 1, Payload: e.b}
}

func decodeHistory(_ uint16, p []byte) (any, error) {
	d := &decoder{b: p}
	s := devices.HistoryState{End: d.u64(), Data: d.bytes32(maxFrame)}
	if d.err == nil && uint64(len(s.Data)) > s.End {
		d.err = fmt.Errorf("%d bytes of history ending at offset %d", len(s.Data), s.End)
	}
	return s, d.finish(msgDevices)
}

func encodeBootTimer(s devices.BootTimerState) DeviceState {
	e := &encoder{}
	e.u8(boolByte(s.Done))
	e.u64(uint64(s.Elapsed))
	return DeviceState{Kind: kindBootTimer, Version: 1, Payload: e.b}
}

func decodeBootTimer(_ uint16, p []byte) (any, error) {
	d := &decoder{b: p}
	s := devices.BootTimerState{Done: d.u8() != 0, Elapsed: time.Duration(d.u64())}
	return s, d.finish(msgDevices)
}

// virtioBlkState is one disk's virtio-mmio transport: its slot (vda is
// 0) and registers.
type virtioBlkState struct {
	Slot  uint16
	State devices.VirtioMMIOState
}

// encodeVirtioBlk encodes a disk's virtio-mmio transport registers (the
// rings are in guest memory).
func encodeVirtioBlk(v virtioBlkState) DeviceState {
	return DeviceState{Kind: kindVirtioBlk, Version: 1, Payload: encodeVirtioMMIO(v.Slot, v.State)}
}

func decodeVirtioBlk(_ uint16, p []byte) (any, error) {
	slot, s, err := decodeVirtioMMIO(p)
	if err != nil {
		return nil, err
	}
	return virtioBlkState{Slot: slot, State: s}, nil
}

// encodeVirtioMMIO encodes a virtio-mmio transport's registers after the
// index of its device (a disk's slot, a network card's number).
func encodeVirtioMMIO(index uint16, s devices.VirtioMMIOState) []byte {
	e := &encoder{}
	e.u16(index)
	e.u32(s.Status)
	e.u32(s.DeviceFeaturesSel)
	e.u32(s.DriverFeaturesSel)
	e.u32(s.QueueSel)
	e.u64(s.DriverFeatures)
	e.u32(s.InterruptStatus)
	e.u16(uint16(len(s.Queues)))
	for _, q := range s.Queues {
		e.u16(q.Num)
		e.u8(boolByte(q.Ready))
		e.u64(q.Desc)
		e.u64(q.Driver)
		e.u64(q.Device)
	}
	return e.b
}

// decodeVirtioMMIO reads what encodeVirtioMMIO wrote.
func decodeVirtioMMIO(p []byte) (uint16, devices.VirtioMMIOState, error) {
	d := &decoder{b: p}
	index := d.u16()
	s := devices.VirtioMMIOState{Status: d.u32(), DeviceFeaturesSel: d.u32(), DriverFeaturesSel: d.u32(), QueueSel: d.u32(),
		DriverFeatures: d.u64(), InterruptStatus: d.u32()}
	n := int(d.u16())
	if d.err == nil && n > maxVirtioQueues {
		d.err = fmt.Errorf("%d virtqueues, at most %d", n, maxVirtioQueues)
	}
	for i := 0; i < n && d.err == nil; i++ {
		q := devices.VirtioQueueState{Num: d.u16(), Ready: d.u8() != 0}
		q.Desc, q.Driver, q.Device = d.u64(), d.u64(), d.u64()
		s.Queues = append(s.Queues, q)
	}
	return index, s, d.finish(msgDevices)
}

// deviceApplier returns what loads a decoded device state into the
// target's VM.
func (t *target) deviceApplier(v any) (func() error, error) {
	vm := t.vm
	switch v := v.(type) {
	case devices.UARTState:
		return func() error {
			vm.Serial().SetState(v)
			vm.Serial().Reassert()
			return nil
		}, nil
	case devices.HistoryState:
		return func() error { vm.Serial().Output().Restore(v); return nil }, nil
	case devices.BootTimerState:
		return func() error { vm.BootTimer().Restore(v); return nil }, nil
	case virtioBlkState:
		blks := vm.VirtioBlks()
		if int(v.Slot) >= len(blks) {
			return nil, fmt.Errorf("applying device state: %w: the source has disk %d, this VM %d disks", ErrIncompatible, v.Slot, len(blks))
		}
		blk := blks[v.Slot]
		return func() error {
			if err := blk.SetState(v.State); err != nil {
				return fmt.Errorf("applying device state: %w: %w", ErrIncompatible, err)
			}
			return nil
		}, nil
	case virtioNetState:
		return t.virtioNetApplier(v)
	}
	panic(fmt.Sprintf("migrate: no applier for %T", v)) // a codec without an applier is a bug, not an input
}

// DeviceVersions returns, for every device state kind, the versions this
// tern reads, lowest first: the codec's own and the one before it.
func DeviceVersions() map[string][]uint16 {
	out := make(map[string][]uint16, len(currentDevices))
	for kind, c := range currentDevices {
		if c.version > 1 {
			out[kind] = []uint16{c.version - 1, c.version}
		} else {
			out[kind] = []uint16{c.version}
		}
	}
	return out
}
