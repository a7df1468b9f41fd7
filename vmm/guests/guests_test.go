package guests

import (
	"bytes"
	"context"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"tern/vmm/guests/internal/build"
)

const xenElfnotePhys32Entry = 18

// pvhEntry returns the 32-bit entry of the PVH note in a PT_NOTE segment.
func pvhEntry(f *elf.File) (uint32, bool) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return 0, false
		}
		for len(b) >= 12 {
			namesz := binary.LittleEndian.Uint32(b[0:])
			descsz := binary.LittleEndian.Uint32(b[4:])
			typ := binary.LittleEndian.Uint32(b[8:])
			nameEnd := 12 + (int(namesz)+3)&^3
			descEnd := nameEnd + (int(descsz)+3)&^3
			if descEnd > len(b) {
				break
			}
			name := string(bytes.TrimRight(b[12:12+namesz], "\x00"))
			if name == "Xen" && typ == xenElfnotePhys32Entry && descsz >= 4 {
				return binary.LittleEndian.Uint32(b[nameEnd:]), true
			}
			b = b[descEnd:]
		}
	}
	return 0, false
}

func TestEveryGuestIsALoadableELF64WithBothEntries(t *testing.T) {
	names := Names()
	if want := []string{"demo", "dirty", "disk", "echo", "hello", "smp", "udp"}; !slices.Equal(names, want) {
		t.Fatalf("Names() = %v, want %v", names, want)
	}
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			b, err := ELF(name)
			if err != nil {
				t.Fatal(err)
			}
			f, err := elf.NewFile(bytes.NewReader(b))
			if err != nil {
				t.Fatalf("parsing ELF: %v", err)
			}
			if f.Class != elf.ELFCLASS64 || f.Machine != elf.EM_X86_64 || f.Type != elf.ET_EXEC {
				t.Fatalf("class %v machine %v type %v, want ELF64 x86-64 executable", f.Class, f.Machine, f.Type)
			}
			if f.Section(".debug_info") != nil || f.Section(".note.gnu.build-id") != nil {
				t.Error("ELF carries debug info or a build id")
			}
			inExec := func(addr uint64) bool {
				for _, p := range f.Progs {
					if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && addr >= p.Paddr && addr < p.Paddr+p.Filesz {
						return true
					}
				}
				return false
			}
			if !inExec(f.Entry) {
				t.Errorf("64-bit entry %#x is not in an executable loaded segment", f.Entry)
			}
			pvh, ok := pvhEntry(f)
			if !ok {
				t.Fatal("no PVH note (XEN_ELFNOTE_PHYS32_ENTRY) in a PT_NOTE segment")
			}
			if !inExec(uint64(pvh)) || uint64(pvh) == f.Entry {
				t.Errorf("PVH entry %#x: want a distinct address in an executable segment (64-bit entry %#x)", pvh, f.Entry)
			}
		})
	}
}

func TestUnknownGuestIsRejected(t *testing.T) {
	for _, name := range []string{"", "nope", "../elf/hello", "hello.elf"} {
		if _, err := ELF(name); !errors.Is(err, ErrUnknownGuest) {
			t.Errorf("ELF(%q) error = %v, want ErrUnknownGuest", name, err)
		}
	}
}

func TestGenerateReproducesCommittedELFs(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles the guests")
	}
	ctx := context.Background()
	version, err := build.CompilerVersion(ctx)
	if errors.Is(err, build.ErrNoCompiler) {
		t.Skip("no cc on PATH: cannot rebuild the guests")
	}
	if err != nil {
		t.Fatal(err)
	}
	committed, err := os.ReadFile(filepath.Join("elf", build.CompilerFile))
	if err != nil {
		t.Fatal(err)
	}
	if strings.TrimSpace(string(committed)) != version {
		t.Skipf("the committed guests were built by %q, this cc is %q: bytes are reproducible per compiler version only",
			strings.TrimSpace(string(committed)), version)
	}
	out := t.TempDir()
	if err := build.Build(ctx, "src", out); err != nil {
		t.Fatal(err)
	}
	for _, name := range build.Guests {
		got, err := os.ReadFile(filepath.Join(out, name+".elf"))
		if err != nil {
			t.Fatal(err)
		}
		want, err := ELF(name)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s.elf differs from the committed file: run `go generate ./vmm/guests` and commit", name)
		}
	}
}

func TestParamsEncodeLayout(t *testing.T) {
	b := Params{MemBytes: 4 << 20, Passes: 3, VirtioBase: 0xd0000000,
		TSCkHz: 2596120, VerifyEverySec: 5, HelloFault: HelloFaultPage, Idle: true,
		VCPUs: 3, APHold: SMPHoldBeforeSIPI}.Encode()
	if len(b) != ParamsSize || string(b[:8]) != "TERNPARM" {
		t.Fatalf("block %q..., len %d", b[:8], len(b))
	}
	for off, want := range map[int]uint64{0x08: 1, 0x18: 4 << 20, 0x28: 3, 0x48: 0xd0000000, 0x10: 0,
		0x50: 2596120, VerifyRequestOffset: 0, VerifyAckOffset: 0, 0x68: 5, 0x70: 4, 0x78: 1,
		0x88: 3, 0x90: 2, APGoOffset: 0} {
		if got := binary.LittleEndian.Uint64(b[off:]); got != want {
			t.Errorf("offset %#x = %#x, want %#x", off, got, want)
		}
	}
}

func TestDefaultsAgreeWithGuestHeader(t *testing.T) {
	h, err := os.ReadFile(filepath.Join("src", "guest.h"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("#define DEFAULT_TSC_KHZ %dULL\n", DefaultTSCkHz),
		fmt.Sprintf("#define PARAMS_ADDR %#xUL\n", ParamsAddr),
		fmt.Sprintf("#define P_VERIFY_REQUEST %#x\n", VerifyRequestOffset),
		fmt.Sprintf("#define P_VERIFY_ACK %#x\n", VerifyAckOffset),
		fmt.Sprintf("#define P_MARK %#x\n", MarkOffset),
		// The offsets TestParamsEncodeLayout pins on the Go side.
		"#define P_TSC_KHZ 0x50\n", "#define P_VERIFY_EVERY_SEC 0x68\n", "#define P_HELLO_FAULT 0x70\n", "#define P_IDLE 0x78\n",
		"#define P_VCPUS 0x88\n", "#define P_AP_HOLD 0x90\n", fmt.Sprintf("#define P_AP_GO %#x\n", APGoOffset),
	} {
		if !bytes.Contains(h, []byte(want)) {
			t.Errorf("src/guest.h lacks %q", want)
		}
	}
}

func TestSMPConstantsAgreeWithItsSource(t *testing.T) {
	for file, wants := range map[string][]string{
		"smp.c": {
			fmt.Sprintf("#define TIMER_MS %d\n", SMPTimerPeriod/time.Millisecond),
			fmt.Sprintf("#define PASS_MS %d\n", SMPPassPeriod/time.Millisecond),
			fmt.Sprintf("#define STALL_PASSES %d\n", SMPStallPasses),
		},
		"smp.h": {fmt.Sprintf("#define SMP_MAX_CPUS %d\n", SMPMaxCPUs)},
	} {
		src, err := os.ReadFile(filepath.Join("src", file))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range wants {
			if !bytes.Contains(src, []byte(want)) {
				t.Errorf("src/%s lacks %q", file, want)
			}
		}
	}
}

func TestDemoConstantsAgreeWithItsSource(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("src", "demo.c"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		fmt.Sprintf("#define DEFAULT_SEED %#xULL\n", DefaultDiskSeed),
		fmt.Sprintf("#define DEFAULT_SECTORS_PER_ROUND %d\n", DefaultDemoSectorsPerRound),
		fmt.Sprintf("#define MAX_SECTORS_PER_ROUND %d\n", MaxDemoSectorsPerRound),
		fmt.Sprintf("#define ROUND_MIX %#xULL\n", uint64(demoRoundMix)),
	} {
		if !bytes.Contains(src, []byte(want)) {
			t.Errorf("src/demo.c lacks %q", want)
		}
	}
}
