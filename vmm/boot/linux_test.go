package boot

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"tern/internal/kvmhost"
	"tern/vmm/memory"
)

// syntheticBzImage builds a bzImage with one setup sector and a kernel of
// kernelSize bytes, as a boot-protocol 2.15 kernel lays out its header.
func syntheticBzImage(kernelSize int) []byte {
	b := make([]byte, 2*512+kernelSize)
	le := binary.LittleEndian
	b[offSetupSects] = 1
	le.PutUint16(b[offBootFlag:], 0xaa55)
	b[offJump] = 0xeb
	b[offJump+1] = 0x66 // header ends at 0x268
	copy(b[offHeader:], "HdrS")
	le.PutUint16(b[offVersion:], 0x020f)
	b[offLoadflags] = LoadedHigh
	le.PutUint32(b[offInitrdAddrMax:], 0x7fffffff)
	le.PutUint32(b[offKernelAlignment:], 0x200000)
	b[offRelocatable] = 1
	le.PutUint16(b[offXLoadflags:], XLFKernel64|2)
	le.PutUint32(b[offCmdlineSize:], 2047)
	le.PutUint64(b[offPrefAddress:], 0x1000000)
	le.PutUint32(b[offInitSize:], 0x20000)
	for i := range kernelSize {
		b[1024+i] = byte(i*7 + 1)
	}
	return b
}

func TestParseBzImageReadsTheSetupHeader(t *testing.T) {
	h, err := ParseBzImage(syntheticBzImage(4096))
	if err != nil {
		t.Fatal(err)
	}
	if h.SetupSects != 1 || h.Version != 0x020f || h.Loadflags != LoadedHigh || h.XLoadflags != 3 ||
		h.KernelAlignment != 0x200000 || !h.Relocatable || h.InitrdAddrMax != 0x7fffffff ||
		h.CmdlineSize != 2047 || h.PrefAddress != 0x1000000 || h.InitSize != 0x20000 {
		t.Errorf("header %+v", *h)
	}
	if len(h.Kernel) != 4096 || h.Kernel[0] != 1 || len(h.Raw) != 0x268-0x1f1 {
		t.Errorf("kernel %d bytes starting %#x, raw header %d bytes", len(h.Kernel), h.Kernel[0], len(h.Raw))
	}
}

func TestParseBzImageRejectsWithTypedErrors(t *testing.T) {
	edit := func(f func(b []byte)) []byte { b := syntheticBzImage(512); f(b); return b }
	cases := []struct {
		name string
		file []byte
		want error
	}{
		{"empty", nil, ErrNotBzImage},
		{"an ELF file", []byte("\x7fELF" + strings.Repeat("\x00", 1024)), ErrNotBzImage},
		{"boot protocol 2.10", edit(func(b []byte) { binary.LittleEndian.PutUint16(b[offVersion:], 0x020a) }), ErrOldBootProtocol},
		{"setup sectors past the end", edit(func(b []byte) { b[offSetupSects] = 40 }), ErrBadBzImage},
		{"header shorter than 2.12's", edit(func(b []byte) { b[offJump+1] = 0x10 }), ErrBadBzImage},
		{"not loaded high", edit(func(b []byte) { b[offLoadflags] = 0 }), ErrBadBzImage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := ParseBzImage(c.file); !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
		})
	}
}

func TestLoadLinuxPlacesKernelCmdlineInitrdAndBootParams(t *testing.T) {
	m := newRAM(t, 64<<20)
	bz := syntheticBzImage(8192)
	initrd := bytes.Repeat([]byte("initrd!!"), 1000) // 8000 bytes
	img, err := LoadLinux(m, bz, initrd, "console=ttyS0 panic=-1")
	if err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	if k, _ := m.Slice(KernelLoadAddr, 8192); !bytes.Equal(k, bz[1024:]) {
		t.Error("kernel not at 1 MiB")
	}
	if c, _ := m.Slice(CmdlineAddr, 23); string(c) != "console=ttyS0 panic=-1\x00" {
		t.Errorf("command line %q", c)
	}
	wantInitrd := memory.GPA((64<<20 - 8000) &^ 0xfff)
	if img.InitrdAddr != wantInitrd {
		t.Errorf("initrd at %#x, want %#x (top of RAM, page-aligned)", uint64(img.InitrdAddr), uint64(wantInitrd))
	}
	if r, _ := m.Slice(img.InitrdAddr, 8000); !bytes.Equal(r, initrd) {
		t.Error("initrd bytes not placed")
	}
	zp, _ := m.Slice(ZeroPageAddr, 4096)
	checks := []struct {
		what      string
		got, want uint64
	}{
		{"boot flag", uint64(le.Uint16(zp[offBootFlag:])), 0xaa55},
		{"version", uint64(le.Uint16(zp[offVersion:])), 0x020f},
		{"type_of_loader", uint64(zp[offTypeOfLoader]), 0xff},
		{"loadflags", uint64(zp[offLoadflags]), LoadedHigh | KeepSegments | CanUseHeap},
		{"cmd_line_ptr", uint64(le.Uint32(zp[offCmdLinePtr:])), 0x20000},
		{"ramdisk_image", uint64(le.Uint32(zp[offRamdiskImage:])), uint64(wantInitrd)},
		{"ramdisk_size", uint64(le.Uint32(zp[offRamdiskSize:])), 8000},
		{"heap_end_ptr", uint64(le.Uint16(zp[offHeapEndPtr:])), 0xfe00},
		{"e820_entries", uint64(zp[offE820Entries]), 3},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %#x, want %#x", c.what, c.got, c.want)
		}
	}
	var e820 []E820Entry
	for i := range int(zp[offE820Entries]) {
		p := zp[offE820Table+20*i:]
		e820 = append(e820, E820Entry{le.Uint64(p), le.Uint64(p[8:]), le.Uint32(p[16:])})
	}
	want := []E820Entry{{0, 0x9fc00, E820RAM}, {0x9fc00, 0x100000 - 0x9fc00, E820Reserved}, {0x100000, 63 << 20, E820RAM}}
	if !slices.Equal(e820, want) {
		t.Errorf("e820 %+v, want %+v", e820, want)
	}
	if got := le.Uint64(zp[offACPIRSDPAddr:]); got != 0 {
		t.Errorf("acpi_rsdp_addr = %#x before SetACPIRSDP, want 0", got)
	}
	if err := SetACPIRSDP(m, 0xe0000); err != nil {
		t.Fatal(err)
	}
	if got := le.Uint64(zp[offACPIRSDPAddr:]); got != 0xe0000 {
		t.Errorf("acpi_rsdp_addr = %#x, want 0xe0000", got)
	}
	st, err := LinuxState(m, img)
	if err != nil {
		t.Fatal(err)
	}
	if st.RIP != 0x100200 || st.RSI != uint64(ZeroPageAddr) || st.EFER&EFERLMA == 0 {
		t.Errorf("RIP %#x RSI %#x EFER %#x: want the 64-bit entry, the zero page, long mode", st.RIP, st.RSI, st.EFER)
	}
}

func TestLoadLinuxRejectsWhatCannotBoot(t *testing.T) {
	no64 := syntheticBzImage(512)
	binary.LittleEndian.PutUint16(no64[offXLoadflags:], 0)
	cases := []struct {
		name    string
		ram     uint64
		bz      []byte
		initrd  []byte
		cmdline string
		want    error
	}{
		{"no 64-bit entry", 8 << 20, no64, nil, "", ErrNoKernel64},
		{"command line too long", 8 << 20, syntheticBzImage(512), nil, strings.Repeat("x", 2048), ErrCmdlineTooLong},
		{"kernel past RAM", 1 << 20, syntheticBzImage(512), nil, "", ErrOutsideRAM},
		{"initrd does not fit", 2 << 20, syntheticBzImage(512), make([]byte, 4<<20), "", ErrOutsideRAM},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := LoadLinux(newRAM(t, c.ram), c.bz, c.initrd, c.cmdline); !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
		})
	}
}

// debianKernel returns the bzImage of the Debian kernel the emulated
// test host boots, from kvmhost's cache (fetched with apt on first use,
// as the KVM tests fetch it): the test runs wherever they do.
func debianKernel(t *testing.T) []byte {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	path, err := kvmhost.EnsureBzImage(ctx, testLogWriter{t})
	if err != nil {
		t.Fatalf("fetching the Debian kernel: %v", err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// testLogWriter sends kvmhost's progress lines to the test log.
type testLogWriter struct{ t *testing.T }

func (w testLogWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func TestLoadLinuxAcceptsDebiansKernel(t *testing.T) {
	bz := debianKernel(t)
	h, err := ParseBzImage(bz)
	if err != nil {
		t.Fatal(err)
	}
	if h.Version < 0x020f || h.XLoadflags&XLFKernel64 == 0 || !h.Relocatable {
		t.Errorf("header %+v: want protocol >= 2.15, a 64-bit entry, relocatable", *h)
	}
	if _, err := LoadLinux(newRAM(t, 256<<20), bz, nil, "console=ttyS0"); err != nil {
		t.Fatal(err)
	}
}

func TestLoadVmlinuxPlacesSegmentsAndAHeaderOfItsOwn(t *testing.T) {
	m := newRAM(t, 64<<20)
	text, data := bytes.Repeat([]byte{0x90}, 8192), bytes.Repeat([]byte("data"), 1024)
	elf := &ELFImage{Entry: 16 << 20, Segments: []ELFSegment{
		{Addr: 16 << 20, Data: text, MemSize: uint64(len(text)), Executable: true},
		{Addr: 17 << 20, Data: data, MemSize: 1 << 20}, // with bss
	}}
	initrd := bytes.Repeat([]byte("initrd!!"), 1000)
	img, err := LoadVmlinux(m, elf, initrd, "console=ttyS0")
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := m.Slice(16<<20, uint64(len(text))); !bytes.Equal(got, text) {
		t.Error("text segment not at its physical address")
	}
	if got, _ := m.Slice(17<<20, uint64(len(data))); !bytes.Equal(got, data) {
		t.Error("data segment not at its physical address")
	}
	if img.InitrdAddr < 18<<20 {
		t.Errorf("initrd at %#x overlaps the kernel, which ends at %#x", uint64(img.InitrdAddr), 18<<20)
	}
	if r, _ := m.Slice(img.InitrdAddr, uint64(len(initrd))); !bytes.Equal(r, initrd) {
		t.Error("initrd bytes not placed")
	}
	zp, _ := m.Slice(ZeroPageAddr, 4096)
	h, err := ParseBzImage(zp) // the zero page's header reads as a bzImage's
	if err != nil {
		t.Fatalf("parsing the zero page's header: %v", err)
	}
	le := binary.LittleEndian
	if h.Version != 0x020f || h.XLoadflags&XLFKernel64 == 0 || !h.Relocatable || h.KernelAlignment != 16<<20 ||
		h.CmdlineSize != 2047 || le.Uint16(zp[offBootFlag:]) != 0xaa55 || zp[offTypeOfLoader] != 0xff ||
		le.Uint32(zp[offCmdLinePtr:]) != uint32(CmdlineAddr) || le.Uint32(zp[offRamdiskImage:]) != uint32(img.InitrdAddr) ||
		le.Uint32(zp[offRamdiskSize:]) != uint32(len(initrd)) || zp[offE820Entries] != 3 {
		t.Errorf("zero page header %+v", *h)
	}
	st, err := LinuxState(m, img)
	if err != nil {
		t.Fatal(err)
	}
	if st.RIP != 16<<20 || st.RSI != uint64(ZeroPageAddr) {
		t.Errorf("RIP %#x RSI %#x; want the ELF entry and the zero page", st.RIP, st.RSI)
	}
	if _, err := LoadVmlinux(newRAM(t, 64<<20), elf, nil, strings.Repeat("x", 2048)); !errors.Is(err, ErrCmdlineTooLong) {
		t.Errorf("a 2048-byte command line: %v; want ErrCmdlineTooLong", err)
	}
	if _, err := LoadVmlinux(newRAM(t, 16<<20), elf, nil, ""); !errors.Is(err, ErrOutsideRAM) {
		t.Errorf("a kernel above RAM: %v; want ErrOutsideRAM", err)
	}
}
