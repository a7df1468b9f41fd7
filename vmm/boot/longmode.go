package boot

import (
	"encoding/binary"
	"fmt"

	"tern/vmm/kvm"
	"tern/vmm/memory"
)

// Fixed guest-physical layout (see doc.go).
const (
	// GDTAddr is where WriteGDT puts the GDT.
	GDTAddr memory.GPA = 0x500
	// PageTablesAddr is where the PML4 goes; the PDPT follows it and then
	// one page directory per GiB mapped.
	PageTablesAddr memory.GPA = 0x1000
	// IdentityMappedGiB is how much of the address space the page tables
	// map 1:1 with 2 MiB pages: 4 GiB, so MMIO below 4 GiB (the boot timer
	// at 0xC0000000, virtio-mmio at 0xfeb00000) is reachable too.
	IdentityMappedGiB = 4
	// ZeroPageAddr is where LoadLinux puts boot_params.
	ZeroPageAddr memory.GPA = 0x7000
	// StackTopAddr is the initial RSP: the stack grows down through the
	// page below it, clear of the parameter block at 0x8000.
	StackTopAddr memory.GPA = 0x10000
	// CmdlineAddr is where LoadLinux puts the kernel command line.
	CmdlineAddr memory.GPA = 0x20000
	// CmdlineMax is the room at CmdlineAddr, including the NUL.
	CmdlineMax = 0x10000
)

// Control-register and EFER bits used by the long-mode state.
const (
	CR0PE   = 1 << 0
	CR0ET   = 1 << 4
	CR0PG   = 1 << 31
	CR4PAE  = 1 << 5
	EFERLME = 1 << 8
	EFERLMA = 1 << 10
)

// Page-table entry bits.
const (
	pteP  = 1 << 0
	pteRW = 1 << 1
	pteUS = 1 << 2
	ptePS = 1 << 7
)

// pteTable is the flags of an entry that points to a lower table: present,
// writable and user. U/S must be set at every level for CPL3 code to reach
// a page, and tern's test guests run their work at CPL3: under nested PVM
// only user-mode code runs natively (CPL0 code is emulated).
const pteTable = pteP | pteRW | pteUS

// PageTablesSize is the bytes the identity page tables occupy.
const PageTablesSize = (2 + IdentityMappedGiB) * memory.PageSize

// BuildPageTables writes identity-mapped 4-level page tables at
// PageTablesAddr covering IdentityMappedGiB with 2 MiB pages (present,
// writable, user-accessible at every level, so CPL3 code reaches RAM and
// the MMIO below 4 GiB) and returns the value for CR3.
func BuildPageTables(m *memory.Memory) (uint64, error) {
	tables, err := m.Slice(PageTablesAddr, PageTablesSize)
	if err != nil {
		return 0, fmt.Errorf("placing page tables: %w", err)
	}
	clear(tables)
	le := binary.LittleEndian
	pml4, pdpt := uint64(PageTablesAddr), uint64(PageTablesAddr)+memory.PageSize
	le.PutUint64(tables[0:], pdpt|pteTable)
	for g := range uint64(IdentityMappedGiB) {
		pd := pdpt + (1+g)*memory.PageSize
		le.PutUint64(tables[memory.PageSize+8*g:], pd|pteTable)
		for i := range uint64(512) {
			phys := (g*512 + i) << 21
			le.PutUint64(tables[(2+g)*memory.PageSize+8*i:], phys|pteTable|ptePS)
		}
	}
	if err := m.MarkDirty(PageTablesAddr, PageTablesSize); err != nil {
		return 0, err
	}
	return pml4, nil
}

// GDT selectors written by WriteGDT.
const (
	SelectorCode = 0x08
	SelectorData = 0x10
	SelectorTSS  = 0x18
)

// gdtEntries are the descriptors: null, 64-bit code (L=1, type 0xb
// execute/read accessed), data (type 0x3 read/write accessed, 4 GiB), and
// a 64-bit busy TSS placeholder, which VMX requires in TR.
var gdtEntries = [4]uint64{
	0,
	descriptor(0xa09b, 0, 0xfffff),
	descriptor(0xc093, 0, 0xfffff),
	descriptor(0x808b, 0, 0xfffff),
}

// descriptor encodes a segment descriptor from its flags (the access byte
// in bits 0-7, the G/DB/L/AVL nibble in bits 12-15), base and 20-bit
// limit.
func descriptor(flags uint16, base, limit uint32) uint64 {
	return uint64(base&0xff000000)<<32 | uint64(flags&0xf0ff)<<40 |
		uint64(limit&0xf0000)<<32 | uint64(base&0x00ffffff)<<16 | uint64(limit&0xffff)
}

// segmentFromDescriptor decodes descriptor d as loaded with selector sel.
func segmentFromDescriptor(sel uint16, d uint64) kvm.Segment {
	limit := uint32(d&0xffff) | uint32(d>>32)&0xf0000
	g := uint8(d >> 55 & 1)
	if g == 1 {
		limit = limit<<12 | 0xfff
	}
	return kvm.Segment{
		Base:     d>>16&0xffffff | d>>32&0xff000000,
		Limit:    limit,
		Selector: sel,
		Type:     uint8(d >> 40 & 0xf),
		S:        uint8(d >> 44 & 1),
		DPL:      uint8(d >> 45 & 3),
		Present:  uint8(d >> 47 & 1),
		AVL:      uint8(d >> 52 & 1),
		L:        uint8(d >> 53 & 1),
		DB:       uint8(d >> 54 & 1),
		G:        g,
	}
}

// CPUState is the initial state of the boot vCPU, as plain data: what
// KVM_SET_REGS and KVM_SET_SREGS need. Its segments and descriptor tables
// are KVM's own types (struct kvm_segment, struct kvm_dtable), so they are
// handed to the vCPU as they are.
type CPUState struct {
	RIP, RSP, RFLAGS uint64
	// RSI carries the zero page's address for Linux; 0 for tern's guests.
	RSI uint64

	CR0, CR3, CR4, EFER uint64

	CS, DS, ES, FS, GS, SS, TR, LDT kvm.Segment
	GDT, IDT                        kvm.DTable
}

// WriteGDT writes the GDT at GDTAddr and returns its GDTR value.
func WriteGDT(m *memory.Memory) (kvm.DTable, error) {
	b := make([]byte, 8*len(gdtEntries))
	for i, d := range gdtEntries {
		binary.LittleEndian.PutUint64(b[8*i:], d)
	}
	if err := m.Write(GDTAddr, b); err != nil {
		return kvm.DTable{}, fmt.Errorf("placing GDT: %w", err)
	}
	return kvm.DTable{Base: uint64(GDTAddr), Limit: uint16(len(b) - 1)}, nil
}

// LongModeState writes the GDT and page tables into m and returns the state
// of a vCPU that starts at entry in 64-bit mode with the stack at
// StackTopAddr and interrupts off.
func LongModeState(m *memory.Memory, entry uint64) (CPUState, error) {
	gdtr, err := WriteGDT(m)
	if err != nil {
		return CPUState{}, err
	}
	cr3, err := BuildPageTables(m)
	if err != nil {
		return CPUState{}, err
	}
	if !m.Contains(StackTopAddr-memory.PageSize, memory.PageSize) {
		return CPUState{}, fmt.Errorf("placing the initial stack: %w", ErrOutsideRAM)
	}
	code := segmentFromDescriptor(SelectorCode, gdtEntries[1])
	data := segmentFromDescriptor(SelectorData, gdtEntries[2])
	return CPUState{
		RIP:    entry,
		RSP:    uint64(StackTopAddr),
		RFLAGS: 2, // bit 1 is reserved and always set; IF clear
		CR0:    CR0PE | CR0ET | CR0PG,
		CR3:    cr3,
		CR4:    CR4PAE,
		EFER:   EFERLME | EFERLMA,
		CS:     code,
		DS:     data, ES: data, FS: data, GS: data, SS: data,
		TR:  segmentFromDescriptor(SelectorTSS, gdtEntries[3]),
		LDT: kvm.Segment{Type: 2, Present: 1, Limit: 0xffff}, // an empty LDT that VMX's guest-state checks accept
		GDT: gdtr,
		IDT: kvm.DTable{}, // none: interrupts are off; tern's guests load their own
	}, nil
}
