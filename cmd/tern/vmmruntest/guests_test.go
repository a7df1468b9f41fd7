package vmmruntest

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
)

func TestVMMRunForwardsStdinToTheEchoGuest(t *testing.T) {
	kvmtest.Require(t)
	stdout, stderr, code := run(t, "typed on stdin\nquit\n", "vmm", "run", "--guest", "echo")
	if code != 0 {
		t.Fatalf("exit status %d; stderr %q", code, stderr)
	}
	for _, want := range []string{guests.EchoReady, "echo: typed on stdin", guests.EchoBye} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout %q lacks %q", stdout, want)
		}
	}
}

func TestVMMRunDiskGuestOnAFile(t *testing.T) {
	kvmtest.Require(t)
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "disk", "--disk", "file:"+path)
	if code != 0 || !strings.Contains(stdout, "disk: PASS 256 sectors") {
		t.Fatalf("exit status %d; stdout %q; stderr %q", code, stdout, stderr)
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for s := uint64(0); s < 256; s++ {
		if !bytes.Equal(got[s*512:(s+1)*512], guests.DiskPattern(guests.DefaultDiskSeed, s)) {
			t.Fatalf("sector %d of %s does not hold the disk guest's pattern", s, path)
		}
	}
}

func TestVMMRunDirtyPrintsItsRate(t *testing.T) {
	kvmtest.Require(t)
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "dirty")
	if code != 0 {
		t.Fatalf("exit status %d; stderr %q", code, stderr)
	}
	found := false
	for _, l := range strings.Split(stdout, "\n") {
		if _, ok := guests.ParseDirtyRate(strings.TrimRight(l, "\r")); ok {
			found = true
		}
	}
	if !found {
		t.Errorf("stdout %q has no rate line", stdout)
	}
}

// tinyELF is an x86-64 ELF executable whose one segment, code, is loaded
// and entered at 1 MiB.
func tinyELF(code []byte) []byte {
	const base, hdr = 0x100000, 64 + 56
	b := make([]byte, hdr+len(code))
	le := binary.LittleEndian
	copy(b, "\x7fELF\x02\x01\x01")
	le.PutUint16(b[16:], 2)  // ET_EXEC
	le.PutUint16(b[18:], 62) // EM_X86_64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], base)
	le.PutUint64(b[32:], 64)
	le.PutUint16(b[52:], 64)
	le.PutUint16(b[54:], 56)
	le.PutUint16(b[56:], 1)
	ph := b[64:]
	le.PutUint32(ph[0:], 1) // PT_LOAD
	le.PutUint32(ph[4:], 5) // R+X
	le.PutUint64(ph[8:], hdr)
	le.PutUint64(ph[16:], base)
	le.PutUint64(ph[24:], base)
	le.PutUint64(ph[32:], uint64(len(code)))
	le.PutUint64(ph[40:], uint64(len(code)))
	copy(b[hdr:], code)
	return b
}

func writeGuest(t *testing.T, name string, code []byte) string {
	path := filepath.Join(t.TempDir(), name+".elf")
	if err := os.WriteFile(path, tinyELF(code), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVMMRunReportsATripleFault(t *testing.T) {
	kvmtest.Require(t)
	guest := writeGuest(t, "triple", []byte{0x0f, 0x0b}) // ud2 with no IDT
	_, stderr, code := run(t, "", "vmm", "run", "--guest", guest)
	if code == 0 || !strings.Contains(stderr, "triple-faulted") {
		t.Fatalf("exit status %d, stderr %q; want non-zero and a triple fault named", code, stderr)
	}
	// The crash report follows, compactly: the vCPU's state (the empty
	// IDT, or, on AMD SVM, where KVM resets the vCPU before it reports the
	// shutdown, the report's word for that) and exits.
	idt := "idt=0x0/0x0"
	if strings.Contains(stderr, "reset by KVM before it reported the shutdown") {
		idt = "cs=0xf000"
	}
	for _, want := range []string{"crash report:", "vCPU 0: mp=", idt, "last exits: SHUTDOWN"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
}

func TestVMMRunTimeoutStopsASpinningGuest(t *testing.T) {
	kvmtest.Require(t)
	guest := writeGuest(t, "spin", []byte{0xeb, 0xfe}) // jmp $
	_, stderr, code := run(t, "", "vmm", "run", "--guest", guest, "--timeout", "200ms")
	if code == 0 || !strings.Contains(stderr, "--timeout") {
		t.Fatalf("exit status %d, stderr %q; want non-zero and the timeout named", code, stderr)
	}
}

func TestVMMRunExitsWithTheGuestsStatus(t *testing.T) {
	kvmtest.Require(t)
	// mov al, 7; out 0xf4, al
	guest := writeGuest(t, "status", []byte{0xb0, 0x07, 0xe6, 0xf4, 0xeb, 0xfe})
	_, stderr, code := run(t, "", "vmm", "run", "--guest", guest)
	if code != 7 {
		t.Fatalf("exit status %d, want 7; stderr %q", code, stderr)
	}
}
