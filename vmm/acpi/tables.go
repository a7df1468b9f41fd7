package acpi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// ErrInvalidSpec is wrapped by every problem Build finds in a Spec.
var ErrInvalidSpec = errors.New("invalid ACPI table spec")

// Where the kernel looks for an RSDP when its boot_params carry none: the
// BIOS read-only area, on 16-byte boundaries (ACPI 6.4, 5.2.5.1). An
// image placed at RSDPScanStart is found either way.
const (
	RSDPScanStart = 0xe0000
	RSDPScanEnd   = 0x100000
	// MaxSize bounds an image: the scanned area's size.
	MaxSize = RSDPScanEnd - RSDPScanStart
)

// The interrupt controllers the MADT describes: KVM's in-kernel ones at
// their architectural addresses.
const (
	// LocalAPICAddr is every local APIC's register window.
	LocalAPICAddr = 0xfee00000
	// IOAPICAddr is the IOAPIC's register window.
	IOAPICAddr = 0xfec00000
	// IOAPICPins is the number of inputs of KVM's IOAPIC: GSIs 0-23.
	IOAPICPins = 24
	// MaxVCPUs is the most CPUs the MADT lists: xAPIC IDs are eight bits,
	// 0xff is the broadcast ID, and the IOAPIC takes the ID after the
	// last CPU's.
	MaxVCPUs = 254
	// MaxSerials is how many serial ports the DSDT names (COM1-COM4).
	MaxSerials = 4
)

// Spec is the machine the tables describe.
type Spec struct {
	// VCPUs is the number of CPUs; CPU i has local APIC ID i (as KVM
	// gives vCPU i), CPU 0 boots.
	VCPUs int
	// Serials are 16550 UARTs (PNP0501): COM1 first.
	Serials []Serial
	// VirtioMMIO are the occupied virtio-mmio slots, in ascending slot
	// order: the kernel enumerates them in this order, which orders
	// vda, vdb, … and eth0, eth1, ….
	VirtioMMIO []VirtioMMIO
	// Power, if set, is the machine's sleep and reset registers: the FADT
	// names them and the DSDT offers soft-off (\_S5), so the kernel's
	// poweroff and reboot reach the VMM instead of ending in a halt or a
	// triple fault.
	Power *Power
}

// Power is the hardware-reduced machine's power registers, one byte-wide
// I/O port each (ACPI 6.4, 4.8.3.7 and 4.8.3.6).
type Power struct {
	// SleepControl takes the sleep type and SLP_EN; SleepStatus reads the
	// wake status.
	SleepControl, SleepStatus uint16
	// Reset resets the machine when ResetValue is written to it.
	Reset      uint16
	ResetValue byte
	// S5Type is the sleep type soft-off writes (\_S5's SLP_TYPa), 0-7.
	S5Type byte
}

// Serial is one UART: eight IO ports from Port, interrupting on GSI.
type Serial struct {
	Port uint16
	GSI  uint32
}

// VirtioMMIO is one occupied virtio-mmio slot: its register window and
// its interrupt line (edge-triggered, active high).
type VirtioMMIO struct {
	// Slot names the device (_UID, and VRxx in hex) and orders it.
	Slot int
	// Base and Size are the register window; it lies below 4 GiB.
	Base, Size uint64
	// GSI is the IOAPIC input the device interrupts on.
	GSI uint32
}

// Image is the built tables: Bytes go at guest-physical Base; the RSDP is
// at Base.
type Image struct {
	Base  uint64
	Bytes []byte
	// Tables are the RSDP and each table, in the order they lie in
	// Bytes: where each went and its bytes (slices of Bytes).
	Tables []Table
}

// Table is one table of an Image.
type Table struct {
	// Signature is "RSD PTR " for the RSDP, else the four-letter table
	// signature (XSDT, FACP, APIC, DSDT).
	Signature string
	Addr      uint64
	Bytes     []byte
}

// RSDPAddr is where the RSDP is: what boot_params.acpi_rsdp_addr takes.
func (img *Image) RSDPAddr() uint64 { return img.Base }

// Table header fields tern writes (ACPI 6.4, 5.2.6).
const (
	headerLen      = 36
	oemID          = "TERN  "
	oemTableID     = "TERNVMM "
	oemRevision    = 1
	creatorID      = "TERN"
	creatorRev     = 1
	tableAlignment = 16
)

// Table revisions: what each table's layout follows.
const (
	rsdpRevision = 2 // ACPI 2.0+: has the XSDT address
	xsdtRevision = 1
	fadtRevision = 6 // ACPI 6.0+ layout, 276 bytes
	fadtMinor    = 0
	madtRevision = 5 // ACPI 6.2+
	dsdtRevision = 2 // 64-bit AML integers
)

// Build validates spec and lays the tables out for guest-physical
// address base: RSDP, XSDT, FADT, MADT, DSDT, each on a 16-byte boundary.
func Build(base uint64, spec Spec) (*Image, error) {
	if err := spec.validate(base); err != nil {
		return nil, err
	}
	dsdtBody := dsdtAML(spec)
	madt := madtTable(spec.VCPUs)
	img := &Image{Base: base}
	// The layout: offsets first, then the tables that point at others.
	off := 0
	next := func(n int) int {
		at := off
		off = align(off+n, tableAlignment)
		return at
	}
	rsdpOff := next(rsdpLen)
	xsdtOff := next(headerLen + 2*8)
	fadtOff := next(fadtLen)
	madtOff := next(len(madt))
	dsdtOff := next(headerLen + len(dsdtBody))
	if off > MaxSize || base+uint64(off) > math.MaxUint32+1 {
		return nil, fmt.Errorf("%w: the tables take %d bytes, more than %d or past 4 GiB from %#x", ErrInvalidSpec, off, MaxSize, base)
	}
	img.Bytes = make([]byte, off)
	addr := func(o int) uint64 { return base + uint64(o) }
	put := func(sig string, o int, b []byte) {
		copy(img.Bytes[o:], b)
		img.Tables = append(img.Tables, Table{Signature: sig, Addr: addr(o), Bytes: img.Bytes[o : o+len(b) : o+len(b)]})
	}
	put("RSD PTR ", rsdpOff, rsdp(addr(xsdtOff)))
	put("XSDT", xsdtOff, xsdt(addr(fadtOff), addr(madtOff)))
	put("FACP", fadtOff, fadt(addr(dsdtOff), spec.Power))
	put("APIC", madtOff, madt)
	put("DSDT", dsdtOff, table("DSDT", dsdtRevision, dsdtBody))
	return img, nil
}

// validate reports every problem of the spec at once.
func (s *Spec) validate(base uint64) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, args...)...))
	}
	if base == 0 || base%tableAlignment != 0 {
		bad("base %#x is not a nonzero multiple of %d", base, tableAlignment)
	}
	if s.VCPUs < 1 || s.VCPUs > MaxVCPUs {
		bad("vcpus: %d, want 1 to %d", s.VCPUs, MaxVCPUs)
	}
	if len(s.Serials) > MaxSerials {
		bad("serials: %d, at most %d", len(s.Serials), MaxSerials)
	}
	for i, c := range s.Serials {
		if c.GSI >= IOAPICPins {
			bad("serials[%d]: GSI %d is not an IOAPIC input (0-%d)", i, c.GSI, IOAPICPins-1)
		}
		if uint32(c.Port)+8 > 0x10000 {
			bad("serials[%d]: ports %#x+8 pass 0xffff", i, c.Port)
		}
	}
	if p := s.Power; p != nil {
		if p.S5Type > 7 {
			bad("power: S5 sleep type %d, want 0 to 7", p.S5Type)
		}
		if p.SleepControl == p.SleepStatus || p.SleepControl == p.Reset || p.SleepStatus == p.Reset {
			bad("power: the registers share ports (control %#x, status %#x, reset %#x)", p.SleepControl, p.SleepStatus, p.Reset)
		}
	}
	for i, d := range s.VirtioMMIO {
		if d.Slot < 0 || d.Slot > 0xff {
			bad("virtio-mmio[%d]: slot %d, want 0 to 255", i, d.Slot)
		}
		if i > 0 && d.Slot <= s.VirtioMMIO[i-1].Slot {
			bad("virtio-mmio[%d]: slot %d does not follow slot %d", i, d.Slot, s.VirtioMMIO[i-1].Slot)
		}
		if d.Size == 0 || d.Size > math.MaxUint32 || d.Base+d.Size < d.Base || d.Base+d.Size > math.MaxUint32+1 {
			bad("virtio-mmio[%d]: window [%#x, +%#x) is empty or not below 4 GiB", i, d.Base, d.Size)
		}
		if d.GSI >= IOAPICPins {
			bad("virtio-mmio[%d]: GSI %d is not an IOAPIC input (0-%d)", i, d.GSI, IOAPICPins-1)
		}
	}
	return errors.Join(errs...)
}

func align(n, to int) int { return (n + to - 1) / to * to }

// checksum returns the byte that makes b, with it added, sum to 0 mod 256.
func checksum(b []byte) byte {
	var sum byte
	for _, c := range b {
		sum += c
	}
	return -sum
}

// table is a System Description Table: the header, then body, with the
// length and checksum filled in.
func table(sig string, revision byte, body []byte) []byte {
	b := make([]byte, headerLen, headerLen+len(body))
	le := binary.LittleEndian
	copy(b[0:4], sig)
	le.PutUint32(b[4:], uint32(headerLen+len(body)))
	b[8] = revision
	copy(b[10:16], oemID)
	copy(b[16:24], oemTableID)
	le.PutUint32(b[24:], oemRevision)
	copy(b[28:32], creatorID)
	le.PutUint32(b[32:], creatorRev)
	b = append(b, body...)
	b[9] = checksum(b)
	return b
}

// RSDP (ACPI 6.4, 5.2.5.3).
const (
	rsdpLen   = 36
	rsdpV1Len = 20 // what the ACPI 1.0 checksum covers
)

// rsdp is the Root System Description Pointer, revision 2: no RSDT, the
// XSDT at xsdtAddr.
func rsdp(xsdtAddr uint64) []byte {
	b := make([]byte, rsdpLen)
	le := binary.LittleEndian
	copy(b[0:8], "RSD PTR ")
	copy(b[9:15], oemID)
	b[15] = rsdpRevision
	le.PutUint32(b[20:], rsdpLen)
	le.PutUint64(b[24:], xsdtAddr)
	b[8] = checksum(b[:rsdpV1Len])
	b[32] = checksum(b)
	return b
}

// xsdt lists the tables the kernel reads first (the DSDT it reaches
// through the FADT).
func xsdt(addrs ...uint64) []byte {
	var body []byte
	for _, a := range addrs {
		body = binary.LittleEndian.AppendUint64(body, a)
	}
	return table("XSDT", xsdtRevision, body)
}

// FADT layout, revision 6 (ACPI 6.4, 5.2.9): the offsets tern writes.
const (
	fadtLen          = 276
	fadtIAPCBootArch = 109
	fadtFlags        = 112
	fadtResetReg     = 116 // a Generic Address Structure
	fadtResetValue   = 128
	fadtMinorVersion = 131
	fadtXDSDT        = 140
	fadtSleepControl = 244 // a Generic Address Structure
	fadtSleepStatus  = 256 // a Generic Address Structure
)

// FADT bits.
const (
	// IA-PC boot architecture flags: no VGA to probe, no CMOS RTC; with
	// LEGACY_DEVICES and 8042 clear, no ISA devices or keyboard
	// controller either.
	iapcVGANotPresent     = 1 << 2
	iapcCMOSRTCNotPresent = 1 << 5
	// fadtHWReducedACPI: no fixed ACPI hardware; the kernel skips the
	// legacy PIC and PIT set-up.
	fadtHWReducedACPI = 1 << 20
	// fadtResetRegSup: RESET_REG is valid.
	fadtResetRegSup = 1 << 10
)

// Generic Address Structure fields (ACPI 6.4, 5.2.3.2).
const (
	gasSystemIO   = 1 // address space: I/O ports
	gasAccessByte = 1
)

// putIOPort writes a Generic Address Structure for one byte-wide I/O
// port at b.
func putIOPort(b []byte, port uint16) {
	b[0], b[1], b[2], b[3] = gasSystemIO, 8, 0, gasAccessByte
	binary.LittleEndian.PutUint64(b[4:], uint64(port))
}

// fadt is the hardware-reduced Fixed ACPI Description Table: no FACS, no
// SCI, no PM blocks; the DSDT's address, the flags and, with power, the
// sleep and reset registers.
func fadt(dsdtAddr uint64, power *Power) []byte {
	body := make([]byte, fadtLen-headerLen)
	le := binary.LittleEndian
	at := func(off int) []byte { return body[off-headerLen:] }
	le.PutUint16(at(fadtIAPCBootArch), iapcVGANotPresent|iapcCMOSRTCNotPresent)
	flags := uint32(fadtHWReducedACPI)
	if power != nil {
		flags |= fadtResetRegSup
		putIOPort(at(fadtResetReg), power.Reset)
		at(fadtResetValue)[0] = power.ResetValue
		putIOPort(at(fadtSleepControl), power.SleepControl)
		putIOPort(at(fadtSleepStatus), power.SleepStatus)
	}
	le.PutUint32(at(fadtFlags), flags)
	at(fadtMinorVersion)[0] = fadtMinor
	le.PutUint64(at(fadtXDSDT), dsdtAddr)
	return table("FACP", fadtRevision, body)
}

// MADT entry types (ACPI 6.4, 5.2.12).
const (
	madtLocalAPIC     = 0
	madtIOAPIC        = 1
	madtLocalAPICLen  = 8
	madtIOAPICLen     = 12
	madtLAPICEnabled  = 1
	madtFixedFieldLen = 8 // local APIC address, flags
)

// madtTable is the Multiple APIC Description Table: one enabled local
// APIC per CPU (ID i, processor UID i) and the IOAPIC, ID vcpus, GSI
// base 0. It has no interrupt source override: KVM's default routing
// wires every ISA line n, the PIT's IRQ 0 among them, to IOAPIC input n,
// the identity the kernel assumes without one (and a hardware-reduced
// kernel does not use the PIT). Flags are 0: the kernel is not to use
// the 8259 pair.
func madtTable(vcpus int) []byte {
	le := binary.LittleEndian
	body := make([]byte, madtFixedFieldLen, madtFixedFieldLen+vcpus*madtLocalAPICLen+madtIOAPICLen)
	le.PutUint32(body[0:], LocalAPICAddr)
	for i := range vcpus {
		body = append(body, madtLocalAPIC, madtLocalAPICLen, byte(i), byte(i))
		body = le.AppendUint32(body, madtLAPICEnabled)
	}
	body = append(body, madtIOAPIC, madtIOAPICLen, byte(vcpus), 0)
	body = le.AppendUint32(body, IOAPICAddr)
	body = le.AppendUint32(body, 0) // GSI base
	return table("APIC", madtRevision, body)
}

// The devices' identifiers.
const (
	virtioMMIOHID = "LNRO0005" // what Linux's virtio_mmio matches in ACPI
	uartHID       = "PNP0501"  // 16550A-compatible COM port
	uartPorts     = 8
)

// dsdtAML is the DSDT's AML: in \_SB, a device per serial port (COMn)
// and per occupied virtio-mmio slot (VRxx, xx the slot in hex); with
// power registers, \_S5 (soft-off's sleep type, for SLP_TYPa and b).
func dsdtAML(s Spec) []byte {
	var devs [][]byte
	for i, c := range s.Serials {
		devs = append(devs, amlDevice(fmt.Sprintf("COM%d", i+1),
			amlName("_HID", amlInteger(uint64(eisaID(uartHID)))),
			amlName("_UID", amlInteger(uint64(i+1))),
			amlName("_CRS", amlResourceTemplate(resIO(c.Port, uartPorts), resInterrupt(c.GSI))),
		))
	}
	for _, d := range s.VirtioMMIO {
		devs = append(devs, amlDevice(fmt.Sprintf("VR%02X", d.Slot),
			amlName("_HID", amlString(virtioMMIOHID)),
			amlName("_UID", amlInteger(uint64(d.Slot))),
			amlName("_CRS", amlResourceTemplate(resMemory32(uint32(d.Base), uint32(d.Size)), resInterrupt(d.GSI))),
		))
	}
	sb := amlScope("_SB", devs...)
	if s.Power == nil {
		return sb
	}
	t := uint64(s.Power.S5Type)
	return cat(amlName("_S5", amlPackage(amlInteger(t), amlInteger(t), amlInteger(0), amlInteger(0))), sb)
}
