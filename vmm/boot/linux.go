package boot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"tern/vmm/memory"
)

// Errors ParseBzImage and LoadLinux return; test with errors.Is.
var (
	// ErrNotBzImage reports a file without the "HdrS" setup header.
	ErrNotBzImage = errors.New("not a Linux bzImage")
	// ErrOldBootProtocol reports a kernel older than boot protocol 2.12.
	ErrOldBootProtocol = errors.New("linux boot protocol too old")
	// ErrNoKernel64 reports a kernel without the 64-bit entry
	// (XLF_KERNEL_64).
	ErrNoKernel64 = errors.New("kernel has no 64-bit entry point")
	// ErrBadBzImage reports a bzImage whose header contradicts the file.
	ErrBadBzImage = errors.New("malformed bzImage")
	// ErrCmdlineTooLong reports a command line longer than the kernel or
	// tern's layout accepts.
	ErrCmdlineTooLong = errors.New("kernel command line too long")
)

// Offsets of setup-header fields in the bzImage (and in boot_params, which
// embeds the header at the same offsets); from the kernel's
// Documentation/arch/x86/boot.rst.
const (
	offSetupSects      = 0x1f1
	offBootFlag        = 0x1fe
	offJump            = 0x200
	offHeader          = 0x202
	offVersion         = 0x206
	offTypeOfLoader    = 0x210
	offLoadflags       = 0x211
	offRamdiskImage    = 0x218
	offRamdiskSize     = 0x21c
	offHeapEndPtr      = 0x224
	offCmdLinePtr      = 0x228
	offInitrdAddrMax   = 0x22c
	offKernelAlignment = 0x230
	offRelocatable     = 0x234
	offXLoadflags      = 0x236
	offCmdlineSize     = 0x238
	offPrefAddress     = 0x258
	offInitSize        = 0x260
	offACPIRSDPAddr    = 0x070
	offE820Entries     = 0x1e8
	offE820Table       = 0x2d0
	maxE820Entries     = 128
	e820EntrySize      = 20
)

// Loadflags and xloadflags bits.
const (
	LoadedHigh   = 1 << 0
	KeepSegments = 1 << 6
	CanUseHeap   = 1 << 7
	XLFKernel64  = 1 << 0
)

// minBootProtocol is 2.12: the first with xloadflags, which says whether
// the 64-bit entry exists.
const minBootProtocol = 0x020c

// KernelLoadAddr is where LoadLinux puts the protected-mode kernel; its
// 64-bit entry is KernelLoadAddr + 0x200.
const KernelLoadAddr memory.GPA = 0x100000

// SetupHeader is the parsed setup header of a bzImage.
type SetupHeader struct {
	// SetupSects is the number of 512-byte setup sectors after the boot
	// sector (0 means 4).
	SetupSects uint8
	// Version is the boot protocol version, major<<8 | minor.
	Version uint16
	// Loadflags and XLoadflags are the header's flag bytes.
	Loadflags  uint8
	XLoadflags uint16
	// KernelAlignment is the alignment a relocatable kernel needs.
	KernelAlignment uint32
	// Relocatable reports relocatable_kernel.
	Relocatable bool
	// InitrdAddrMax is the highest address the initrd may end at.
	InitrdAddrMax uint32
	// CmdlineSize is the longest command line the kernel takes.
	CmdlineSize uint32
	// PrefAddress is the preferred load address; InitSize is the memory
	// the kernel needs from its load address while it decompresses.
	PrefAddress uint64
	InitSize    uint32
	// Raw is the header as it appears in the file, from 0x1f1 to its
	// end, for copying into boot_params.
	Raw []byte
	// Kernel is the protected-mode kernel: the file past the setup
	// sectors; it aliases the parsed file.
	Kernel []byte
}

// ParseBzImage parses a bzImage's setup header. It never panics.
func ParseBzImage(b []byte) (*SetupHeader, error) {
	if len(b) < offVersion+2 || string(b[offHeader:offHeader+4]) != "HdrS" {
		return nil, ErrNotBzImage
	}
	le := binary.LittleEndian
	h := &SetupHeader{Version: le.Uint16(b[offVersion:])}
	if h.Version < minBootProtocol {
		return nil, fmt.Errorf("%w: version %d.%02d, need 2.12", ErrOldBootProtocol, h.Version>>8, h.Version&0xff)
	}
	// The header ends where the jump at 0x200 lands: 0x202 + its offset.
	hdrEnd := offHeader + int(b[offJump+1])
	if hdrEnd < offInitSize+4 || hdrEnd > len(b) || hdrEnd > 0x290 {
		return nil, fmt.Errorf("%w: setup header ends at %#x", ErrBadBzImage, hdrEnd)
	}
	h.SetupSects = b[offSetupSects]
	h.Loadflags = b[offLoadflags]
	h.XLoadflags = le.Uint16(b[offXLoadflags:])
	h.KernelAlignment = le.Uint32(b[offKernelAlignment:])
	h.Relocatable = b[offRelocatable] != 0
	h.InitrdAddrMax = le.Uint32(b[offInitrdAddrMax:])
	h.CmdlineSize = le.Uint32(b[offCmdlineSize:])
	h.PrefAddress = le.Uint64(b[offPrefAddress:])
	h.InitSize = le.Uint32(b[offInitSize:])
	h.Raw = b[offSetupSects:hdrEnd:hdrEnd]
	sects := int(h.SetupSects)
	if sects == 0 {
		sects = 4
	}
	kernelOff := (sects + 1) * 512
	if kernelOff >= len(b) {
		return nil, fmt.Errorf("%w: %d setup sectors leave no kernel in %d bytes", ErrBadBzImage, sects, len(b))
	}
	h.Kernel = b[kernelOff:len(b):len(b)]
	if h.Loadflags&LoadedHigh == 0 {
		return nil, fmt.Errorf("%w: kernel does not load high", ErrBadBzImage)
	}
	return h, nil
}

// E820 types.
const (
	E820RAM      = 1
	E820Reserved = 2
)

// E820Entry is one entry of the memory map given to Linux.
type E820Entry struct {
	Addr, Size uint64
	Type       uint32
}

// E820Map derives the memory map from guest RAM: every region is RAM,
// except that the legacy hole [0x9fc00, 0x100000) (EBDA, VGA, BIOS) is
// reported reserved where a region covers it. vmm puts a Linux guest's
// ACPI tables in that hole's BIOS area (from 0xe0000, see vmm/acpi), so
// the kernel neither allocates nor overwrites them.
func E820Map(m *memory.Memory) []E820Entry {
	const holeStart, holeEnd = 0x9fc00, 0x100000
	var out []E820Entry
	for _, r := range m.Regions() {
		start, end := uint64(r.Base()), uint64(r.Base())+r.Size()
		if start < holeEnd && end > holeStart {
			if start < holeStart {
				out = append(out, E820Entry{start, holeStart - start, E820RAM})
			}
			rs, re := max(start, holeStart), min(end, holeEnd)
			out = append(out, E820Entry{rs, re - rs, E820Reserved})
			if end > holeEnd {
				out = append(out, E820Entry{holeEnd, end - holeEnd, E820RAM})
			}
			continue
		}
		out = append(out, E820Entry{start, end - start, E820RAM})
	}
	return out
}

// BootParams builds the 4 KiB zero page: the kernel's setup header with
// tern's loader fields, the command line and initrd addresses, and the
// e820 map.
func BootParams(h *SetupHeader, cmdlineAddr uint64, initrdAddr, initrdSize uint32, e820 []E820Entry) ([]byte, error) {
	if len(e820) > maxE820Entries {
		return nil, fmt.Errorf("building boot_params: %d e820 entries, at most %d", len(e820), maxE820Entries)
	}
	if cmdlineAddr > math.MaxUint32 {
		return nil, fmt.Errorf("building boot_params: command line above 4 GiB")
	}
	zp := make([]byte, memory.PageSize)
	copy(zp[offSetupSects:], h.Raw)
	le := binary.LittleEndian
	zp[offTypeOfLoader] = 0xff // undefined loader
	zp[offLoadflags] = h.Loadflags | LoadedHigh | CanUseHeap | KeepSegments
	le.PutUint16(zp[offHeapEndPtr:], 0xfe00)
	le.PutUint32(zp[offCmdLinePtr:], uint32(cmdlineAddr))
	le.PutUint32(zp[offRamdiskImage:], initrdAddr)
	le.PutUint32(zp[offRamdiskSize:], initrdSize)
	zp[offE820Entries] = uint8(len(e820))
	for i, e := range e820 {
		p := zp[offE820Table+i*e820EntrySize:]
		le.PutUint64(p[0:], e.Addr)
		le.PutUint64(p[8:], e.Size)
		le.PutUint32(p[16:], e.Type)
	}
	return zp, nil
}

// LinuxImage is where LoadLinux put things.
type LinuxImage struct {
	Header     *SetupHeader
	Entry64    uint64
	InitrdAddr memory.GPA
	E820       []E820Entry
}

// LoadLinux places a bzImage's kernel at KernelLoadAddr, the command line
// at CmdlineAddr, the initrd (may be nil) page-aligned as high as RAM below
// 4 GiB and the header's initrd_addr_max allow, and the zero page at
// ZeroPageAddr. Start the vCPU with LinuxState.
func LoadLinux(m *memory.Memory, bz []byte, initrd []byte, cmdline string) (*LinuxImage, error) {
	h, err := ParseBzImage(bz)
	if err != nil {
		return nil, err
	}
	if h.XLoadflags&XLFKernel64 == 0 {
		return nil, ErrNoKernel64
	}
	if len(cmdline)+1 > CmdlineMax || (h.CmdlineSize != 0 && uint64(len(cmdline)) > uint64(h.CmdlineSize)) {
		return nil, fmt.Errorf("%w: %d bytes, kernel takes %d", ErrCmdlineTooLong, len(cmdline), h.CmdlineSize)
	}
	need := max(uint64(len(h.Kernel)), uint64(h.InitSize))
	if !m.Contains(KernelLoadAddr, need) {
		return nil, fmt.Errorf("loading kernel [%#x, +%#x): %w", uint64(KernelLoadAddr), need, ErrOutsideRAM)
	}
	if err := m.Write(KernelLoadAddr, h.Kernel); err != nil {
		return nil, fmt.Errorf("loading kernel: %w", err)
	}
	img := &LinuxImage{Header: h, Entry64: uint64(KernelLoadAddr) + 0x200}
	return img, placeBootData(m, img, uint64(KernelLoadAddr)+need, initrd, cmdline)
}

// vmlinuxHeaderEnd is where the setup header tern writes for a vmlinux
// ends: past init_size, the last field LoadLinux reads.
const vmlinuxHeaderEnd = offInitSize + 4

// vmlinuxCmdlineSize is the longest command line x86 Linux keeps
// (COMMAND_LINE_SIZE, 2048, with its NUL).
const vmlinuxCmdlineSize = 2047

// VmlinuxHeader is the setup header tern gives an uncompressed kernel,
// which has none of its own: boot protocol 2.15, loaded high, the 64-bit
// entry, relocatable at 16 MiB alignment, the initrd below 2 GiB.
func VmlinuxHeader() *SetupHeader {
	raw := make([]byte, vmlinuxHeaderEnd-offSetupSects)
	at := func(off int) []byte { return raw[off-offSetupSects:] }
	le := binary.LittleEndian
	h := &SetupHeader{
		Version: 0x020f, Loadflags: LoadedHigh, XLoadflags: XLFKernel64,
		KernelAlignment: 16 << 20, Relocatable: true,
		InitrdAddrMax: 0x7fffffff, CmdlineSize: vmlinuxCmdlineSize, Raw: raw,
	}
	le.PutUint16(at(offBootFlag), 0xaa55)
	at(offJump)[0], at(offJump)[1] = 0xeb, vmlinuxHeaderEnd-offHeader // jmp past the header, as a bzImage has
	copy(at(offHeader), "HdrS")
	le.PutUint16(at(offVersion), h.Version)
	at(offLoadflags)[0] = h.Loadflags
	le.PutUint32(at(offInitrdAddrMax), h.InitrdAddrMax)
	le.PutUint32(at(offKernelAlignment), h.KernelAlignment)
	at(offRelocatable)[0] = 1
	le.PutUint16(at(offXLoadflags), h.XLoadflags)
	le.PutUint32(at(offCmdlineSize), h.CmdlineSize)
	return h
}

// LoadVmlinux places an uncompressed ELF kernel (vmlinux, e.g. what
// internal/kvmhost extracts from a bzImage) at its segments' physical
// addresses, then the command line, initrd and zero page as LoadLinux
// does, with VmlinuxHeader as the setup header. Its 64-bit entry is the
// ELF entry (startup_64), which takes RSI pointing at the zero page as a
// bzImage's does; it skips the bzImage's decompressor. Start the vCPU
// with LinuxState.
func LoadVmlinux(m *memory.Memory, elf *ELFImage, initrd []byte, cmdline string) (*LinuxImage, error) {
	h := VmlinuxHeader()
	if len(cmdline) > int(h.CmdlineSize) {
		return nil, fmt.Errorf("%w: %d bytes, kernel takes %d", ErrCmdlineTooLong, len(cmdline), h.CmdlineSize)
	}
	if err := LoadELF(m, elf); err != nil {
		return nil, fmt.Errorf("loading vmlinux: %w", err)
	}
	var end uint64
	for _, s := range elf.Segments {
		end = max(end, uint64(s.Addr)+s.MemSize)
	}
	img := &LinuxImage{Header: h, Entry64: elf.Entry}
	return img, placeBootData(m, img, end, initrd, cmdline)
}

// SetACPIRSDP records rsdp, the guest-physical address of the ACPI RSDP,
// in boot_params.acpi_rsdp_addr of the zero page LoadLinux or
// LoadVmlinux placed at ZeroPageAddr; call it after them. Kernels since
// 5.0 take the RSDP from there before they scan the BIOS area for one
// (older ones ignore the field, which was padding).
func SetACPIRSDP(m *memory.Memory, rsdp memory.GPA) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(rsdp))
	if err := m.Write(ZeroPageAddr+offACPIRSDPAddr, b[:]); err != nil {
		return fmt.Errorf("recording the ACPI RSDP in boot_params: %w", err)
	}
	return nil
}

// placeBootData writes the command line, the initrd above floor (the
// kernel's end) and the zero page, and fills in img's E820 and
// InitrdAddr.
func placeBootData(m *memory.Memory, img *LinuxImage, floor uint64, initrd []byte, cmdline string) error {
	h := img.Header
	if err := m.Write(CmdlineAddr, append([]byte(cmdline), 0)); err != nil {
		return fmt.Errorf("placing command line: %w", err)
	}
	img.E820 = E820Map(m)
	if len(initrd) > 0 {
		addr, err := placeInitrd(m, h, uint64(len(initrd)), floor)
		if err != nil {
			return err
		}
		if err := m.Write(addr, initrd); err != nil {
			return fmt.Errorf("loading initrd: %w", err)
		}
		img.InitrdAddr = addr
	}
	zp, err := BootParams(h, uint64(CmdlineAddr), uint32(img.InitrdAddr), uint32(len(initrd)), img.E820)
	if err != nil {
		return err
	}
	if err := m.Write(ZeroPageAddr, zp); err != nil {
		return fmt.Errorf("placing boot_params: %w", err)
	}
	return nil
}

// placeInitrd picks the highest page-aligned address at which size bytes
// fit inside one RAM region, end at or below initrd_addr_max (and 4 GiB),
// and start at or above floor (the kernel's end).
func placeInitrd(m *memory.Memory, h *SetupHeader, size, floor uint64) (memory.GPA, error) {
	limit := uint64(h.InitrdAddrMax) + 1
	if h.InitrdAddrMax == 0 {
		limit = 0x38000000 // the protocol's default for old kernels
	}
	limit = min(limit, 1<<32)
	regions := m.Regions()
	for i := len(regions) - 1; i >= 0; i-- {
		r := regions[i]
		end := min(uint64(r.Base())+r.Size(), limit)
		if end < size {
			continue
		}
		addr := (end - size) &^ (memory.PageSize - 1)
		if addr >= uint64(r.Base()) && addr >= floor {
			return memory.GPA(addr), nil
		}
	}
	return 0, fmt.Errorf("placing initrd of %d bytes: %w", size, ErrOutsideRAM)
}

// LinuxState returns the state of a vCPU entering img's 64-bit entry in
// long mode, with RSI pointing at the zero page (boot protocol 2.12+'s
// 64-bit entry). It writes the GDT and page tables into m.
func LinuxState(m *memory.Memory, img *LinuxImage) (CPUState, error) {
	st, err := LongModeState(m, img.Entry64)
	if err != nil {
		return CPUState{}, err
	}
	st.RSI = uint64(ZeroPageAddr)
	return st, nil
}
