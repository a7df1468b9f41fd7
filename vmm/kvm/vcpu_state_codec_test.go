package kvm

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

// sampleState is a VCPUState with every section present and distinctive
// values in each.
func sampleState() *VCPUState {
	s := &VCPUState{
		CPUID:  []CPUIDEntry2{{Function: 1, EAX: 0x806f8}, {Function: 0xd, Index: 1, EBX: 0x240}},
		TSCKHz: 2_100_000,
		Regs:   Regs{RAX: 1, RBX: 2, RIP: 0x100000, RFLAGS: 2, R15: 15},
		Sregs:  Sregs{CR0: 0x80000011, CR3: 0x1000, CR4: 0x220, EFER: 0x500, APICBase: 0xfee00900},
		XSAVE:  bytes.Repeat([]byte{0xa5}, 4096),
		XCRs:   []XCR{{XCR: 0, Value: 7}},
		MSRs:   []MSREntry{{Index: MSRIA32TSC, Data: 123456789}, {Index: 0xc0000100, Data: 0xdead}},
		LAPIC:  &LAPICState{},
		MP:     MPStateHalted,
	}
	s.Sregs.CS = Segment{Selector: 8, Type: 0xb, Present: 1, S: 1, L: 1}
	s.FPU.FCW, s.FPU.MXCSR, s.FPU.XMM[3][0] = 0x37f, 0x1f80, 9
	s.LAPIC.Regs[0x20] = 1
	s.Events.Flags, s.Events.NMI.Masked, s.Events.Exception.ErrorCode = 5, 1, 0xe
	return s
}

func TestVCPUStateRoundTrip(t *testing.T) {
	for _, c := range []struct {
		name  string
		state *VCPUState
	}{
		{"every section", sampleState()},
		{"required sections only", &VCPUState{Regs: Regs{RIP: 0xfff0}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := c.state.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			var got VCPUState
			if err := got.UnmarshalBinary(b); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(&got, c.state) {
				t.Fatalf("round trip changed the state:\n got %+v\nwant %+v", got, *c.state)
			}
		})
	}
}

// TestVCPUStateEncodingIsStable pins the header and the first section, so
// a change to the format shows up as a failing test, not as a migration
// that cannot decode.
func TestVCPUStateEncodingIsStable(t *testing.T) {
	b, err := (&VCPUState{}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("TERNVCPU\x01\x00\x03\x00\x90\x00\x00\x00")
	if !bytes.HasPrefix(b, want) {
		t.Fatalf("encoding starts % x, want % x", b[:len(want)], want)
	}
	// header + regs 144 + sregs 312 + fpu 416 + events 64 + mp 4, each with 6 bytes of section header.
	if wantLen := 10 + 5*6 + 144 + 312 + 416 + 64 + 4; len(b) != wantLen {
		t.Fatalf("minimal encoding is %d bytes, want %d", len(b), wantLen)
	}
}

func TestVCPUStateRejectsMalformed(t *testing.T) {
	good, err := sampleState().MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	minimal, err := (&VCPUState{}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	regsSection := minimal[10 : 10+6+144]
	for _, c := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"wrong magic", append([]byte("TERNVCPX"), good[8:]...)},
		{"future version", append(append([]byte("TERNVCPU"), 2, 0), good[10:]...)},
		{"truncated", good[:len(good)-1]},
		{"section header cut", good[:12]},
		{"required section missing", good[:10]},
		{"section repeated", append(append([]byte(nil), minimal[:10+6+144]...), append(regsSection, minimal[10+6+144:]...)...)},
		{"unknown section", append(append([]byte(nil), good...), 0x63, 0, 0, 0, 0, 0)},
	} {
		t.Run(c.name, func(t *testing.T) {
			var s VCPUState
			if err := s.UnmarshalBinary(c.b); !errors.Is(err, ErrBadState) {
				t.Fatalf("UnmarshalBinary = %v, want ErrBadState", err)
			}
		})
	}
}

// FuzzVCPUStateUnmarshal feeds the decoder arbitrary bytes: it must never
// panic, and whatever it accepts must encode and decode to the same state.
func FuzzVCPUStateUnmarshal(f *testing.F) {
	for _, s := range []*VCPUState{sampleState(), {}} {
		b, err := s.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("TERNVCPU\x01\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s VCPUState
		if s.UnmarshalBinary(b) != nil {
			return
		}
		again, err := s.MarshalBinary()
		if err != nil {
			t.Fatalf("re-encoding a decoded state: %v", err)
		}
		var s2 VCPUState
		if err := s2.UnmarshalBinary(again); err != nil {
			t.Fatalf("decoding a re-encoded state: %v", err)
		}
		if !reflect.DeepEqual(s, s2) {
			t.Fatalf("decode(encode(decode(b))) differs from decode(b)")
		}
	})
}
