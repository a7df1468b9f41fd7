package acpi

import "encoding/binary"

// A small encoder of the AML the DSDT needs (ACPI 6.4, chapter 20): names,
// devices in a scope, strings, integers and buffers, and the resource
// descriptors of a _CRS (chapter 6.4). Each function returns the encoding
// of one term; callers concatenate them.

// AML opcodes and prefixes.
const (
	amlZeroOp       = 0x00
	amlOneOp        = 0x01
	amlNameOp       = 0x08
	amlBytePrefix   = 0x0a
	amlWordPrefix   = 0x0b
	amlDWordPrefix  = 0x0c
	amlStringPrefix = 0x0d
	amlQWordPrefix  = 0x0e
	amlScopeOp      = 0x10
	amlBufferOp     = 0x11
	amlPackageOp    = 0x12
	amlExtOpPrefix  = 0x5b
	amlDeviceOp     = 0x82 // after amlExtOpPrefix
	amlRootChar     = '\\'
)

// pkgLength encodes the PkgLength of a package whose contents after the
// PkgLength are n bytes long: the length counts its own bytes, one to
// four of them. The first byte holds the count of bytes that follow in
// bits 7-6 and, for a one-byte length, the length in bits 5-0; otherwise
// the low nibble of the length, with 8 more bits in each following byte.
// n must be below 2^28-4, the most a PkgLength encodes (a DSDT within
// MaxSize is far smaller).
func pkgLength(n int) []byte {
	switch {
	case n+1 < 1<<6:
		return []byte{byte(n + 1)}
	case n+2 < 1<<12:
		t := n + 2
		return []byte{1<<6 | byte(t&0xf), byte(t >> 4)}
	case n+3 < 1<<20:
		t := n + 3
		return []byte{2<<6 | byte(t&0xf), byte(t >> 4), byte(t >> 12)}
	default:
		t := n + 4
		return []byte{3<<6 | byte(t&0xf), byte(t >> 4), byte(t >> 12), byte(t >> 20)}
	}
}

// pkg is a package: its PkgLength, then body.
func pkg(body []byte) []byte {
	return append(pkgLength(len(body)), body...)
}

// cat joins terms.
func cat(terms ...[]byte) []byte {
	var out []byte
	for _, t := range terms {
		out = append(out, t...)
	}
	return out
}

// amlNameSeg is a NameSeg: four characters, A-Z, 0-9 or '_', not starting
// with a digit. The names tern uses are constants or built by Build, which
// keeps them valid; a shorter name is padded with '_' as ASL pads it.
func amlNameSeg(s string) []byte {
	b := []byte("____")
	copy(b, s)
	return b
}

// amlRootName is the NameString of a name segment under the root
// ("\_SB_").
func amlRootName(seg string) []byte {
	return append([]byte{amlRootChar}, amlNameSeg(seg)...)
}

// amlName is Name(name, object).
func amlName(seg string, object []byte) []byte {
	return cat([]byte{amlNameOp}, amlNameSeg(seg), object)
}

// amlString is a String constant: ASCII bytes and a NUL.
func amlString(s string) []byte {
	return cat([]byte{amlStringPrefix}, []byte(s), []byte{0})
}

// amlInteger is an integer constant in its shortest encoding.
func amlInteger(v uint64) []byte {
	switch {
	case v == 0:
		return []byte{amlZeroOp}
	case v == 1:
		return []byte{amlOneOp}
	case v <= 0xff:
		return []byte{amlBytePrefix, byte(v)}
	case v <= 0xffff:
		return binary.LittleEndian.AppendUint16([]byte{amlWordPrefix}, uint16(v))
	case v <= 0xffffffff:
		return binary.LittleEndian.AppendUint32([]byte{amlDWordPrefix}, uint32(v))
	default:
		return binary.LittleEndian.AppendUint64([]byte{amlQWordPrefix}, v)
	}
}

// amlBuffer is Buffer(len(b)) { b }.
func amlBuffer(b []byte) []byte {
	return cat([]byte{amlBufferOp}, pkg(cat(amlInteger(uint64(len(b))), b)))
}

// amlPackage is Package() { elements }: at most 255 of them.
func amlPackage(elements ...[]byte) []byte {
	return cat([]byte{amlPackageOp}, pkg(cat([]byte{byte(len(elements))}, cat(elements...))))
}

// amlScope is Scope(\seg) { terms }.
func amlScope(seg string, terms ...[]byte) []byte {
	return cat([]byte{amlScopeOp}, pkg(cat(amlRootName(seg), cat(terms...))))
}

// amlDevice is Device(seg) { terms }.
func amlDevice(seg string, terms ...[]byte) []byte {
	return cat([]byte{amlExtOpPrefix, amlDeviceOp}, pkg(cat(amlNameSeg(seg), cat(terms...))))
}

// eisaID compresses a seven-character PNP ID such as "PNP0501" the way
// ASL's EISAID() does: three letters of five bits each and four hex
// digits, stored big-endian in the 32-bit integer. id must be three
// capital letters and four hex digits (the IDs are constants).
func eisaID(id string) uint32 {
	hex := func(c byte) uint32 {
		switch {
		case c >= '0' && c <= '9':
			return uint32(c - '0')
		case c >= 'A' && c <= 'F':
			return uint32(c-'A') + 10
		}
		return 0
	}
	v := uint32(id[0]-'@')<<26 | uint32(id[1]-'@')<<21 | uint32(id[2]-'@')<<16 |
		hex(id[3])<<12 | hex(id[4])<<8 | hex(id[5])<<4 | hex(id[6])
	return v>>24 | v>>8&0xff00 | v<<8&0xff0000 | v<<24
}

// Resource descriptors (ACPI 6.4, 6.4.2 small and 6.4.3 large).
const (
	resIOPort        = 0x47 // small item 0x08, length 7
	resEndTag        = 0x79 // small item 0x0f, length 1
	resMemory32Fixed = 0x86 // large item 0x06
	resExtInterrupt  = 0x89 // large item 0x09
)

// Extended interrupt descriptor flags.
const (
	intConsumer = 1 << 0 // else producer
	intEdge     = 1 << 1 // else level; bit 2 (active low) and bit 3 (shared) stay clear
)

// resIO is IO(Decode16, base, base, 0, length): a fixed 16-bit decoded
// port range.
func resIO(base uint16, length uint8) []byte {
	b := []byte{resIOPort, 1} // decodes all 16 address bits
	b = binary.LittleEndian.AppendUint16(b, base)
	b = binary.LittleEndian.AppendUint16(b, base)
	return append(b, 0, length)
}

// resMemory32 is Memory32Fixed(ReadWrite, base, size).
func resMemory32(base, size uint32) []byte {
	b := []byte{resMemory32Fixed, 9, 0, 1} // length 9, read-write
	b = binary.LittleEndian.AppendUint32(b, base)
	return binary.LittleEndian.AppendUint32(b, size)
}

// resInterrupt is Interrupt(ResourceConsumer, Edge, ActiveHigh,
// Exclusive) { gsi }: how every interrupt tern raises is wired.
func resInterrupt(gsi uint32) []byte {
	b := []byte{resExtInterrupt, 6, 0, intConsumer | intEdge, 1}
	return binary.LittleEndian.AppendUint32(b, gsi)
}

// amlResourceTemplate is ResourceTemplate() { descs }: a buffer of the
// descriptors and an EndTag. The EndTag's checksum is 0, which the
// specification defines as "treat the data as if its checksum matched"
// (6.4.2.9) and which iasl and ACPICA's resource manager write: a template
// ACPICA converts and re-encodes then compares equal to tern's.
func amlResourceTemplate(descs ...[]byte) []byte {
	return amlBuffer(append(cat(descs...), resEndTag, 0))
}
