package migration

import (
	"fmt"

	"tern/vmm/kvm"
)

// A Linux guest's in-kernel platform (vmm.PlatformState): one irqchip
// entry per interrupt controller (the PIC pair and the IOAPIC) and the
// PIT. Their payloads are the kernel's own structs, byte for byte (KVM's
// ABI, the same on every x86-64 host), after the chip's ID.
const (
	kindIRQChip = "irqchip"
	kindPIT     = "pit"
)

// irqChipState is one interrupt controller's registers.
type irqChipState struct{ State kvm.IRQChipState }

// pitState is the i8254's channels.
type pitState struct{ State kvm.PITState }

func encodeIRQChip(c kvm.IRQChipState) DeviceState {
	e := &encoder{}
	e.u32(c.ChipID)
	e.b = append(e.b, c.Chip[:]...)
	return DeviceState{Kind: kindIRQChip, Version: 1, Payload: e.b}
}

func decodeIRQChip(_ uint16, p []byte) (any, error) {
	d := &decoder{b: p}
	var c kvm.IRQChipState
	c.ChipID = d.u32()
	if d.err == nil && c.ChipID > kvm.IRQChipIOAPIC {
		d.err = fmt.Errorf("irqchip %d: KVM has chips 0 to %d", c.ChipID, kvm.IRQChipIOAPIC)
	}
	copy(c.Chip[:], d.take(len(c.Chip)))
	return irqChipState{c}, d.finish(msgDevices)
}

func encodePIT(s kvm.PITState) DeviceState {
	return DeviceState{Kind: kindPIT, Version: 1, Payload: append([]byte(nil), s.State[:]...)}
}

func decodePIT(_ uint16, p []byte) (any, error) {
	d := &decoder{b: p}
	var s kvm.PITState
	copy(s.State[:], d.take(len(s.State)))
	return pitState{s}, d.finish(msgDevices)
}
