package vmm

import "tern/vmm/devices"

// The virtio-mmio slots. Every virtio device of a VM sits in one slot: a
// register window of devices.MMIOSize at VirtioSlotAddr and, for a Linux
// guest, an interrupt line of the in-kernel IOAPIC at VirtioSlotGSI,
// edge-triggered and active high (an irqfd pulses it). The disks take
// slots 0 to MaxDisks-1 in order (vda, vdb, …), the network cards the
// slots after them. The ACPI DSDT describes each slot a device is in;
// tern's own guests find the disks at VirtioBlkAddr.
const (
	// MaxNICs is how many virtio-net devices a VM may have.
	MaxNICs = 4
	// VirtioSlots is the number of virtio-mmio slots.
	VirtioSlots = MaxDisks + MaxNICs
)

// virtioSlotGSIs are the slots' interrupt lines: the IOAPIC's pins 16-23,
// which no ISA device claims, for the disks, then ISA lines no device of
// tern's uses (COM1 has 4) for the network cards.
var virtioSlotGSIs = [VirtioSlots]uint32{16, 17, 18, 19, 20, 21, 22, 23, 5, 7, 10, 11}

// VirtioSlotAddr is the base of slot i's register window.
func VirtioSlotAddr(i int) uint64 { return VirtioBlkBase + uint64(i)*devices.MMIOSize }

// VirtioSlotGSI is slot i's interrupt line.
func VirtioSlotGSI(i int) uint32 { return virtioSlotGSIs[i] }

// NICSlot is the slot of network card j.
func NICSlot(j int) int { return MaxDisks + j }
