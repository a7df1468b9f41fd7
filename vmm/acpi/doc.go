// Package acpi builds the ACPI tables tern gives a Linux guest: an RSDP
// (revision 2) pointing at an XSDT, which lists a hardware-reduced FADT
// (revision 6) and a MADT; the FADT points at a DSDT whose AML describes
// the serial port and every occupied virtio-mmio slot. It is a pure
// builder: Build turns a Spec into bytes for one guest-physical address
// and touches no KVM, memory or file.
//
// Why ACPI, and why hardware-reduced: Debian's kernel finds virtio-mmio
// devices only in the DSDT (its virtio_mmio driver matches _HID
// "LNRO0005"; it has no command-line device option), and it learns of
// more than one CPU and of the IOAPIC only from the MADT (or an MP
// table). The FADT's HW_REDUCED_ACPI flag tells the kernel there is no
// legacy PIC to drive, no PIT to set up as its timer and no fixed ACPI
// hardware (PM timer, SCI, PM1 blocks), which is true of what tern
// wires: interrupts go through the IOAPIC, the clock is kvmclock and the
// timer the local APIC's TSC deadline. With no legacy PIC the kernel maps
// ISA interrupts only where a device asks for them, so the serial port is
// a DSDT device too (PNP0501 with its IRQ), as on Cloud Hypervisor and
// Firecracker.
//
// Invariants:
//   - Every table's checksum makes its bytes sum to 0 mod 256; the RSDP
//     has both its ACPI 1.0 checksum (first 20 bytes) and its extended
//     one (all 36). Each resource template ends in an EndTag with
//     checksum 0, "valid", as iasl writes it.
//   - Every address in a table is the absolute guest-physical address of
//     the table it names, for the one base Build was given; the image is
//     at most MaxSize bytes, so it fits the BIOS area the kernel scans
//     for an RSDP (RSDPScanStart to RSDPScanEnd) when placed there.
//   - Build validates the whole Spec first and reports every problem at
//     once (ErrInvalidSpec); it never panics on a Spec.
//   - iasl -d (ACPICA's disassembler, a real ACPI client) reads every
//     table without an error; the tests run it.
package acpi
