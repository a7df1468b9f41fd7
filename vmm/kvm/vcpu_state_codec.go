package kvm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// The encoding of a VCPUState, stable across tern versions:
//
//	magic    8 bytes "TERNVCPU"
//	version  uint16 (stateVersion)
//	sections, each: tag uint16, length uint32, payload of length bytes
//
// All integers are little-endian; fixed-size payloads are the kernel
// structs field by field (their padding written as zero). Sections appear
// in increasing tag order, each at most once; regs, sregs, fpu, events
// and mp are required, the rest optional (absent means the source lacked
// it). An unknown tag is an error: dropping state silently would restore
// a different machine. A new field means a new section or a new version.
//
// Decoding never panics and allocates at most in proportion to its input:
// the bytes come from the network during a migration.

// ErrBadState reports an encoded VCPUState that cannot be decoded.
var ErrBadState = errors.New("malformed vCPU state")

const (
	stateMagic   = "TERNVCPU"
	stateVersion = 1
)

// Section tags.
const (
	tagCPUID uint16 = 1 + iota
	tagTSCKHz
	tagRegs
	tagSregs
	tagFPU
	tagXSAVE
	tagXCRs
	tagMSRs
	tagLAPIC
	tagEvents
	tagMP
	tagEnd // one past the last tag
)

// Limits on variable sections, well above any real vCPU's.
const (
	maxStateCPUID   = 4096
	maxStateMSRs    = 4096
	maxStateXSAVE   = 1 << 20
	stateHeaderSize = len(stateMagic) + 2
)

// MarshalBinary encodes s (see the format above).
func (s *VCPUState) MarshalBinary() ([]byte, error) {
	b := append([]byte(stateMagic), 0, 0)
	binary.LittleEndian.PutUint16(b[len(stateMagic):], stateVersion)
	section := func(tag uint16, v any) {
		payload, err := binary.Append(nil, binary.LittleEndian, v)
		if err != nil {
			panic(fmt.Sprintf("kvm: encoding section %d: %v", tag, err)) // a fixed-size type is broken
		}
		b = binary.LittleEndian.AppendUint16(b, tag)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(payload)))
		b = append(b, payload...)
	}
	if s.CPUID != nil {
		if len(s.CPUID) > maxStateCPUID {
			return nil, fmt.Errorf("encoding vCPU state: %d CPUID entries, at most %d", len(s.CPUID), maxStateCPUID)
		}
		section(tagCPUID, s.CPUID)
	}
	if s.TSCKHz != 0 {
		section(tagTSCKHz, s.TSCKHz)
	}
	section(tagRegs, &s.Regs)
	section(tagSregs, &s.Sregs)
	section(tagFPU, &s.FPU)
	if s.XSAVE != nil {
		if len(s.XSAVE) > maxStateXSAVE {
			return nil, fmt.Errorf("encoding vCPU state: XSAVE of %d bytes, at most %d", len(s.XSAVE), maxStateXSAVE)
		}
		section(tagXSAVE, s.XSAVE)
	}
	if s.XCRs != nil {
		if len(s.XCRs) > maxXCRs {
			return nil, fmt.Errorf("encoding vCPU state: %d XCRs, at most %d", len(s.XCRs), maxXCRs)
		}
		section(tagXCRs, s.XCRs)
	}
	if s.MSRs != nil {
		if len(s.MSRs) > maxStateMSRs {
			return nil, fmt.Errorf("encoding vCPU state: %d MSRs, at most %d", len(s.MSRs), maxStateMSRs)
		}
		section(tagMSRs, s.MSRs)
	}
	if s.LAPIC != nil {
		section(tagLAPIC, s.LAPIC)
	}
	section(tagEvents, &s.Events)
	section(tagMP, uint32(s.MP))
	return b, nil
}

// UnmarshalBinary decodes b into s; a malformed b is an error wrapping
// ErrBadState, never a panic.
func (s *VCPUState) UnmarshalBinary(b []byte) error {
	var out VCPUState
	if err := out.decode(b); err != nil {
		return fmt.Errorf("decoding vCPU state: %w: %w", ErrBadState, err)
	}
	*s = out
	return nil
}

func (s *VCPUState) decode(b []byte) error {
	if len(b) < stateHeaderSize || !bytes.Equal(b[:len(stateMagic)], []byte(stateMagic)) {
		return errors.New("no TERNVCPU header")
	}
	if v := binary.LittleEndian.Uint16(b[len(stateMagic):]); v != stateVersion {
		return fmt.Errorf("version %d, this tern reads %d", v, stateVersion)
	}
	b = b[stateHeaderSize:]
	var seen [tagEnd]bool
	last := uint16(0)
	for len(b) > 0 {
		if len(b) < 6 {
			return fmt.Errorf("truncated section header (%d bytes)", len(b))
		}
		tag, n := binary.LittleEndian.Uint16(b), binary.LittleEndian.Uint32(b[2:])
		b = b[6:]
		if uint64(n) > uint64(len(b)) {
			return fmt.Errorf("section %d: %d bytes, %d left", tag, n, len(b))
		}
		payload := b[:n]
		b = b[n:]
		if tag == 0 || tag >= tagEnd {
			return fmt.Errorf("unknown section %d", tag)
		}
		if tag <= last {
			return fmt.Errorf("section %d after section %d", tag, last)
		}
		last, seen[tag] = tag, true
		if err := s.decodeSection(tag, payload); err != nil {
			return fmt.Errorf("section %d: %w", tag, err)
		}
	}
	for _, t := range []uint16{tagRegs, tagSregs, tagFPU, tagEvents, tagMP} {
		if !seen[t] {
			return fmt.Errorf("required section %d missing", t)
		}
	}
	return nil
}

// decodeSection decodes one section's payload into s.
func (s *VCPUState) decodeSection(tag uint16, p []byte) error {
	switch tag {
	case tagCPUID:
		return decodeSlice(p, &s.CPUID, maxStateCPUID)
	case tagTSCKHz:
		return decodeFixed(p, &s.TSCKHz)
	case tagRegs:
		return decodeFixed(p, &s.Regs)
	case tagSregs:
		return decodeFixed(p, &s.Sregs)
	case tagFPU:
		return decodeFixed(p, &s.FPU)
	case tagXSAVE:
		if len(p) < xsaveLegacySize || len(p) > maxStateXSAVE || len(p)%4 != 0 {
			return fmt.Errorf("XSAVE of %d bytes", len(p))
		}
		s.XSAVE = bytes.Clone(p)
		return nil
	case tagXCRs:
		return decodeSlice(p, &s.XCRs, maxXCRs)
	case tagMSRs:
		return decodeSlice(p, &s.MSRs, maxStateMSRs)
	case tagLAPIC:
		s.LAPIC = new(LAPICState)
		return decodeFixed(p, s.LAPIC)
	case tagEvents:
		return decodeFixed(p, &s.Events)
	case tagMP:
		var mp uint32
		err := decodeFixed(p, &mp)
		s.MP = MPState(mp)
		return err
	}
	return fmt.Errorf("unknown section %d", tag) // unreachable: decode checks the range
}

// decodeFixed decodes exactly one fixed-size value from p.
func decodeFixed[T any](p []byte, v *T) error {
	if want := binary.Size(v); len(p) != want {
		return fmt.Errorf("%d bytes, want %d", len(p), want)
	}
	_, err := binary.Decode(p, binary.LittleEndian, v)
	return err
}

// decodeSlice decodes p as a whole number of up to max fixed-size
// elements; an empty section is an empty, non-nil slice.
func decodeSlice[T any](p []byte, out *[]T, max int) error {
	var zero T
	size := binary.Size(zero)
	if len(p)%size != 0 || len(p)/size > max {
		return fmt.Errorf("%d bytes is not up to %d elements of %d", len(p), max, size)
	}
	v := make([]T, len(p)/size)
	if _, err := binary.Decode(p, binary.LittleEndian, v); err != nil {
		return err
	}
	*out = v
	return nil
}
