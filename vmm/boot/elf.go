package boot

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"tern/vmm/memory"
)

// Errors ParseELF and LoadELF return; test with errors.Is.
var (
	// ErrNotELF reports a file without the ELF magic or too short for a
	// header.
	ErrNotELF = errors.New("not an ELF file")
	// ErrNotELF64 reports an ELF file that is not 64-bit little-endian.
	ErrNotELF64 = errors.New("not a 64-bit little-endian ELF file")
	// ErrWrongMachine reports an ELF file for another architecture or of a
	// type other than an executable.
	ErrWrongMachine = errors.New("not an x86-64 ELF executable")
	// ErrBadELF reports an ELF file whose headers contradict themselves.
	ErrBadELF = errors.New("malformed ELF file")
	// ErrOutsideRAM reports something to load that does not lie wholly
	// inside one region of guest RAM.
	ErrOutsideRAM = errors.New("does not fit in guest RAM")
)

// xenElfnotePhys32Entry is the PVH note type: a 32-bit entry address.
const xenElfnotePhys32Entry = 18

// TernNoteLocalAPICs is the type of the note (name "tern", no
// descriptor) by which a guest asks for the in-kernel local APICs and
// starts its application processors itself: see ELFImage.LocalAPICs.
const TernNoteLocalAPICs = 1

const (
	ptLoad = 1
	ptNote = 4
	pfX    = 1
)

// ELFSegment is one PT_LOAD segment.
type ELFSegment struct {
	// Addr is the guest-physical load address (p_paddr).
	Addr memory.GPA
	// Data is the file's bytes for the segment (p_filesz); it aliases the
	// parsed file.
	Data []byte
	// MemSize is the segment's size in memory; bytes past Data are zero.
	MemSize uint64
	// Executable reports PF_X.
	Executable bool
}

// ELFImage is a parsed ELF64 guest: what to load and where to start.
type ELFImage struct {
	// Entry is the ELF entry point, a 64-bit entry.
	Entry uint64
	// PVHEntry is the 32-bit entry of the XEN_ELFNOTE_PHYS32_ENTRY note;
	// HasPVH reports whether the note exists.
	PVHEntry uint32
	HasPVH   bool
	// LocalAPICs reports the TernNoteLocalAPICs note: the guest drives
	// its local APICs (KVM's in-kernel irqchip) and starts its
	// application processors with INIT and start-up IPIs, so the VMM
	// leaves them in the reset state.
	LocalAPICs bool
	// Segments are the PT_LOAD segments in file order.
	Segments []ELFSegment
}

// ParseELF parses an x86-64 ELF64 executable. It never panics.
func ParseELF(b []byte) (*ELFImage, error) {
	if len(b) < 64 || string(b[:4]) != "\x7fELF" {
		return nil, ErrNotELF
	}
	if b[4] != 2 || b[5] != 1 { // ELFCLASS64, ELFDATA2LSB
		return nil, ErrNotELF64
	}
	le := binary.LittleEndian
	if typ, machine := le.Uint16(b[16:]), le.Uint16(b[18:]); typ != 2 || machine != 62 {
		return nil, fmt.Errorf("%w: e_type %d, e_machine %d", ErrWrongMachine, typ, machine)
	}
	img := &ELFImage{Entry: le.Uint64(b[24:])}
	phoff, phentsize, phnum := le.Uint64(b[32:]), uint64(le.Uint16(b[54:])), uint64(le.Uint16(b[56:]))
	if phnum == 0 {
		return nil, fmt.Errorf("%w: no program headers", ErrBadELF)
	}
	if phentsize < 56 || phoff > uint64(len(b)) || phnum*phentsize > uint64(len(b))-phoff {
		return nil, fmt.Errorf("%w: program headers outside the file", ErrBadELF)
	}
	for i := range phnum {
		ph := b[phoff+i*phentsize:][:56]
		typ, flags := le.Uint32(ph[0:]), le.Uint32(ph[4:])
		off, paddr := le.Uint64(ph[8:]), le.Uint64(ph[24:])
		filesz, memsz := le.Uint64(ph[32:]), le.Uint64(ph[40:])
		if typ != ptLoad && typ != ptNote {
			continue
		}
		if off > uint64(len(b)) || filesz > uint64(len(b))-off {
			return nil, fmt.Errorf("%w: segment %d's bytes lie outside the file", ErrBadELF, i)
		}
		data := b[off : off+filesz : off+filesz]
		switch typ {
		case ptLoad:
			if memsz < filesz || paddr > math.MaxUint64-memsz {
				return nil, fmt.Errorf("%w: segment %d has memsz %d < filesz %d or wraps", ErrBadELF, i, memsz, filesz)
			}
			img.Segments = append(img.Segments, ELFSegment{
				Addr: memory.GPA(paddr), Data: data, MemSize: memsz, Executable: flags&pfX != 0,
			})
		case ptNote:
			readNotes(data, img)
		}
	}
	if len(img.Segments) == 0 {
		return nil, fmt.Errorf("%w: no loadable segments", ErrBadELF)
	}
	if !img.inExecutable(img.Entry) {
		return nil, fmt.Errorf("%w: entry %#x is not inside an executable segment", ErrBadELF, img.Entry)
	}
	return img, nil
}

// inExecutable reports whether addr lies in an executable segment.
func (img *ELFImage) inExecutable(addr uint64) bool {
	for _, s := range img.Segments {
		if s.Executable && addr >= uint64(s.Addr) && addr-uint64(s.Addr) < s.MemSize {
			return true
		}
	}
	return false
}

// readNotes walks ELF notes (4-byte aligned) for the PVH entry note and
// tern's own, recording what it finds in img; it stops at a note that
// does not fit.
func readNotes(b []byte, img *ELFImage) {
	le := binary.LittleEndian
	for len(b) >= 12 {
		namesz, descsz, typ := uint64(le.Uint32(b[0:])), uint64(le.Uint32(b[4:])), le.Uint32(b[8:])
		nameEnd := 12 + (namesz+3)&^3
		descEnd := nameEnd + (descsz+3)&^3
		if namesz > uint64(len(b)) || descsz > uint64(len(b)) || descEnd > uint64(len(b)) {
			return
		}
		name := string(b[12 : 12+namesz])
		switch {
		case name == "Xen\x00" && typ == xenElfnotePhys32Entry && descsz >= 4:
			img.PVHEntry, img.HasPVH = le.Uint32(b[nameEnd:]), true
		case name == "tern\x00" && typ == TernNoteLocalAPICs:
			img.LocalAPICs = true
		}
		b = b[descEnd:]
	}
}

// LoadELF copies the image's segments into guest memory, zero-filling
// each segment's tail. It checks every segment fits before writing any.
func LoadELF(m *memory.Memory, img *ELFImage) error {
	for i, s := range img.Segments {
		if !m.Contains(s.Addr, s.MemSize) {
			return fmt.Errorf("loading segment %d [%#x, +%#x): %w", i, uint64(s.Addr), s.MemSize, ErrOutsideRAM)
		}
	}
	for _, s := range img.Segments {
		dst, err := m.Slice(s.Addr, s.MemSize)
		if err != nil {
			return fmt.Errorf("loading segment at %#x: %w", uint64(s.Addr), err)
		}
		n := copy(dst, s.Data)
		clear(dst[n:])
		if err := m.MarkDirty(s.Addr, s.MemSize); err != nil {
			return err
		}
	}
	return nil
}
