package acpi

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// twelveSlots is a spec with every slot tern has occupied: eight disks on
// GSIs 16-23 and four network cards on ISA lines.
func twelveSlots(vcpus int) Spec {
	s := Spec{VCPUs: vcpus, Serials: []Serial{{Port: 0x3f8, GSI: 4}}}
	gsis := []uint32{16, 17, 18, 19, 20, 21, 22, 23, 5, 7, 10, 11}
	for i, g := range gsis {
		s.VirtioMMIO = append(s.VirtioMMIO, VirtioMMIO{Slot: i, Base: 0xfeb00000 + uint64(i)*0x200, Size: 0x200, GSI: g})
	}
	return s
}

var testSpecs = []struct {
	name string
	spec Spec
}{
	{"one CPU, no devices", Spec{VCPUs: 1}},
	{"two CPUs, COM1, one disk", Spec{VCPUs: 2, Serials: []Serial{{0x3f8, 4}}, VirtioMMIO: []VirtioMMIO{{Slot: 0, Base: 0xfeb00000, Size: 0x200, GSI: 16}}}},
	{"a disk and a network card", Spec{VCPUs: 4, Serials: []Serial{{0x3f8, 4}}, VirtioMMIO: []VirtioMMIO{{Slot: 1, Base: 0xfeb00200, Size: 0x200, GSI: 17}, {Slot: 8, Base: 0xfeb01000, Size: 0x200, GSI: 5}}}},
	{"every slot", twelveSlots(8)},
	{"the most CPUs", twelveSlots(MaxVCPUs)},
}

// tableAt returns the table of img at addr, by its header's length.
func tableAt(t *testing.T, img *Image, addr uint64) []byte {
	t.Helper()
	if addr < img.Base || addr+headerLen > img.Base+uint64(len(img.Bytes)) {
		t.Fatalf("table address %#x outside the image [%#x, +%#x)", addr, img.Base, len(img.Bytes))
	}
	b := img.Bytes[addr-img.Base:]
	n := binary.LittleEndian.Uint32(b[4:])
	if n < headerLen || uint64(n) > uint64(len(b)) {
		t.Fatalf("table at %#x: length %d does not fit the image", addr, n)
	}
	return b[:n]
}

func sum(b []byte) byte {
	var s byte
	for _, c := range b {
		s += c
	}
	return s
}

func TestTablesChecksumAndPointAtEachOther(t *testing.T) {
	for _, c := range testSpecs {
		t.Run(c.name, func(t *testing.T) {
			img, err := Build(RSDPScanStart, c.spec)
			if err != nil {
				t.Fatal(err)
			}
			if len(img.Bytes) > MaxSize {
				t.Fatalf("image of %d bytes, more than %d", len(img.Bytes), MaxSize)
			}
			le := binary.LittleEndian
			r := img.Bytes[:rsdpLen]
			if img.RSDPAddr() != RSDPScanStart || string(r[:8]) != "RSD PTR " || r[15] != 2 {
				t.Fatalf("RSDP at %#x: signature %q revision %d", img.RSDPAddr(), r[:8], r[15])
			}
			if sum(r[:20]) != 0 || sum(r) != 0 {
				t.Fatalf("RSDP checksums: first 20 bytes sum to %#x, all 36 to %#x; want 0, 0", sum(r[:20]), sum(r))
			}
			if n := le.Uint32(r[20:]); n != rsdpLen {
				t.Fatalf("RSDP length %d, want %d", n, rsdpLen)
			}
			seen := map[string][]byte{}
			check := func(want string, addr uint64) []byte {
				b := tableAt(t, img, addr)
				if string(b[:4]) != want {
					t.Fatalf("table at %#x is %q, want %q", addr, b[:4], want)
				}
				if s := sum(b); s != 0 {
					t.Fatalf("%s sums to %#x, want 0", want, s)
				}
				if addr%tableAlignment != 0 {
					t.Fatalf("%s at %#x: not on a %d-byte boundary", want, addr, tableAlignment)
				}
				seen[want] = b
				return b
			}
			x := check("XSDT", le.Uint64(r[24:]))
			if len(x) != headerLen+16 {
				t.Fatalf("XSDT of %d bytes, want two entries", len(x))
			}
			f := check("FACP", le.Uint64(x[36:]))
			check("APIC", le.Uint64(x[44:]))
			if len(f) != fadtLen || f[8] != 6 {
				t.Fatalf("FADT length %d revision %d, want %d, 6", len(f), f[8], fadtLen)
			}
			if le.Uint32(f[fadtFlags:])&fadtHWReducedACPI == 0 {
				t.Fatal("FADT without HW_REDUCED_ACPI")
			}
			if le.Uint32(f[40:]) != 0 || le.Uint64(f[132:]) != 0 || le.Uint32(f[36:]) != 0 {
				t.Fatal("FADT names a 32-bit DSDT or a FACS; tern gives only X_DSDT")
			}
			check("DSDT", le.Uint64(f[fadtXDSDT:]))
			for _, tb := range img.Tables {
				if tb.Signature == "RSD PTR " {
					continue
				}
				if b, ok := seen[tb.Signature]; !ok || &b[0] != &tb.Bytes[0] || len(b) != len(tb.Bytes) {
					t.Errorf("Tables lists %s at %#x, which the pointers do not reach as such", tb.Signature, tb.Addr)
				}
			}
		})
	}
}

func TestMADTListsEachCPUThenTheIOAPIC(t *testing.T) {
	for _, n := range []int{1, 2, 7, MaxVCPUs} {
		img, err := Build(RSDPScanStart, Spec{VCPUs: n})
		if err != nil {
			t.Fatal(err)
		}
		m := img.Tables[3].Bytes
		if img.Tables[3].Signature != "APIC" {
			t.Fatalf("table 3 is %s", img.Tables[3].Signature)
		}
		le := binary.LittleEndian
		if a := le.Uint32(m[36:]); a != LocalAPICAddr {
			t.Fatalf("local APIC address %#x", a)
		}
		var cpus []int
		ioapics := 0
		for p := m[headerLen+madtFixedFieldLen:]; len(p) > 0; p = p[p[1]:] {
			if len(p) < 2 || p[1] < 2 || int(p[1]) > len(p) {
				t.Fatalf("malformed MADT entry % x", p)
			}
			switch p[0] {
			case madtLocalAPIC:
				if p[2] != p[3] || le.Uint32(p[4:]) != 1 {
					t.Fatalf("CPU entry % x: want UID = APIC ID, enabled", p[:8])
				}
				cpus = append(cpus, int(p[3]))
			case madtIOAPIC:
				ioapics++
				if int(p[2]) != n || le.Uint32(p[4:]) != IOAPICAddr || le.Uint32(p[8:]) != 0 {
					t.Fatalf("IOAPIC entry % x: want ID %d at %#x, GSI base 0", p[:12], n, IOAPICAddr)
				}
			default:
				t.Fatalf("unexpected MADT entry type %d", p[0])
			}
		}
		if len(cpus) != n || ioapics != 1 {
			t.Fatalf("%d vCPUs: MADT lists %d CPUs and %d IOAPICs", n, len(cpus), ioapics)
		}
		for i, id := range cpus {
			if id != i {
				t.Fatalf("CPU entry %d has APIC ID %d", i, id)
			}
		}
	}
}

func TestBuildRejectsEveryProblemAtOnce(t *testing.T) {
	ok := VirtioMMIO{Slot: 0, Base: 0xfeb00000, Size: 0x200, GSI: 16}
	for _, c := range []struct {
		name string
		base uint64
		spec Spec
		want []string
	}{
		{"no CPU", RSDPScanStart, Spec{}, []string{"vcpus: 0"}},
		{"too many CPUs", RSDPScanStart, Spec{VCPUs: 255}, []string{"vcpus: 255"}},
		{"unaligned base", RSDPScanStart + 8, Spec{VCPUs: 1}, []string{"base 0xe0008"}},
		{"zero base", 0, Spec{VCPUs: 1}, []string{"base 0x0"}},
		{"GSI past the IOAPIC", RSDPScanStart, Spec{VCPUs: 1, VirtioMMIO: []VirtioMMIO{{Base: 0xfeb00000, Size: 0x200, GSI: 24}}}, []string{"GSI 24"}},
		{"slots out of order", RSDPScanStart, Spec{VCPUs: 1, VirtioMMIO: []VirtioMMIO{{Slot: 1, Base: 0xfeb00200, Size: 0x200, GSI: 17}, ok}}, []string{"slot 0 does not follow slot 1"}},
		{"window past 4 GiB", RSDPScanStart, Spec{VCPUs: 1, VirtioMMIO: []VirtioMMIO{{Base: 0xffffff00, Size: 0x200, GSI: 16}}}, []string{"not below 4 GiB"}},
		{"empty window", RSDPScanStart, Spec{VCPUs: 1, VirtioMMIO: []VirtioMMIO{{Base: 0xfeb00000, GSI: 16}}}, []string{"is empty"}},
		{"slot out of range", RSDPScanStart, Spec{VCPUs: 1, VirtioMMIO: []VirtioMMIO{{Slot: 256, Base: 0xfeb00000, Size: 0x200, GSI: 16}}}, []string{"slot 256"}},
		{"serial GSI and ports", RSDPScanStart, Spec{VCPUs: 1, Serials: []Serial{{Port: 0xfffc, GSI: 30}}}, []string{"GSI 30", "ports 0xfffc"}},
		{"five serials", RSDPScanStart, Spec{VCPUs: 1, Serials: make([]Serial, 5)}, []string{"serials: 5"}},
		{"all at once", 1, Spec{VCPUs: -1, VirtioMMIO: []VirtioMMIO{{Slot: -1, GSI: 99}}}, []string{"base 0x1", "vcpus: -1", "slot -1", "is empty", "GSI 99"}},
		{"past 4 GiB", 0xffffff00, Spec{VCPUs: 1}, []string{"past 4 GiB from 0xffffff00"}},
		{"power registers sharing a port and a bad S5 type", RSDPScanStart, Spec{VCPUs: 1, Power: &Power{SleepControl: 0x600, SleepStatus: 0x600, Reset: 0x602, S5Type: 8}},
			[]string{"S5 sleep type 8", "share ports (control 0x600, status 0x600, reset 0x602)"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			img, err := Build(c.base, c.spec)
			if !errors.Is(err, ErrInvalidSpec) || img != nil {
				t.Fatalf("Build returned an image: %v, error %v; want none and ErrInvalidSpec", img != nil, err)
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

func TestPkgLengthEncodesItsOwnBytes(t *testing.T) {
	// decode is the PkgLength rule read the other way: the total the
	// bytes encode, and how many there are.
	decode := func(b []byte) (total, n int) {
		n = int(b[0]>>6) + 1
		if n == 1 {
			return int(b[0] & 0x3f), 1
		}
		total = int(b[0] & 0xf)
		for i := 1; i < n; i++ {
			total |= int(b[i]) << (4 + 8*(i-1))
		}
		return total, n
	}
	for _, body := range []int{0, 1, 61, 62, 63, 64, 0xffd, 0xffe, 0xfffff - 3, 0xfffff - 2, 1<<28 - 5} {
		b := pkgLength(body)
		total, n := decode(b)
		if n != len(b) || total != body+len(b) {
			t.Errorf("pkgLength(%d) = % x: encodes %d in %d bytes, want %d in %d", body, b, total, n, body+len(b), len(b))
		}
		if n > 1 && b[0]&0x30 != 0 {
			t.Errorf("pkgLength(%d) = % x: bits 5-4 of a multi-byte lead must be 0", body, b)
		}
	}
}

func TestEISAIDCompressesAsASLDoes(t *testing.T) {
	for id, want := range map[string]uint32{"PNP0501": 0x0105d041, "PNP0A03": 0x030ad041, "PNP0C0F": 0x0f0cd041} {
		if got := eisaID(id); got != want {
			t.Errorf("eisaID(%s) = %#x, want %#x", id, got, want)
		}
	}
}

func TestIntegersTakeTheirShortestEncoding(t *testing.T) {
	for v, want := range map[uint64]string{0: "00", 1: "01", 2: "0a 02", 0xff: "0a ff", 0x100: "0b 00 01", 0xfeb00000: "0c 00 00 b0 fe", 1 << 32: "0e 00 00 00 00 01 00 00 00"} {
		if got := fmt.Sprintf("% x", amlInteger(v)); got != want {
			t.Errorf("amlInteger(%#x) = %s, want %s", v, got, want)
		}
	}
}
