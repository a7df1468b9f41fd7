package linuxguest

import (
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestParseDependsClosureKeepsRealPackagesSorted(t *testing.T) {
	out := []byte(`e2fsprogs
  PreDepends: libblkid1
  PreDepends: libc6
 |Depends: logsave
  Depends: <awk>
    mawk
busybox-static
libc6
  Depends: libgcc-s1
<awk>
libgcc-s1
`)
	got, err := parseDependsClosure(out, []string{"busybox-static", "e2fsprogs"})
	want := []string{"busybox-static", "e2fsprogs", "libc6", "libgcc-s1"}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("parseDependsClosure = %v, %v; want %v", got, err, want)
	}
	// apt-cache drops a name it does not know without a word.
	if _, err := parseDependsClosure([]byte("busybox-static\n"), []string{"busybox-static", "e2fsprogs"}); err == nil || !strings.Contains(err.Error(), "e2fsprogs") {
		t.Fatalf("a missing root = %v, want an error naming e2fsprogs", err)
	}
}

func FuzzParseDependsClosure(f *testing.F) {
	f.Add([]byte("a\n  Depends: b\nb\n<c>\n"), "a")
	f.Add([]byte("E: No packages found\n"), "x")
	f.Fuzz(func(t *testing.T, out []byte, root string) {
		pkgs, err := parseDependsClosure(out, []string{root})
		if err != nil {
			return
		}
		if !slices.Contains(pkgs, root) || !slices.IsSorted(pkgs) {
			t.Fatalf("parseDependsClosure = %v without error, want sorted and holding %q", pkgs, root)
		}
		for _, p := range pkgs {
			if len(strings.Fields(p)) != 1 || strings.ContainsAny(p, ":<>") {
				t.Fatalf("package name %q", p)
			}
		}
	})
}

// TestInitScriptSaysWhatTheConstantsSay keeps /init and the Go side in
// step: the lines the tests wait for are the ones it prints.
func TestInitScriptSaysWhatTheConstantsSay(t *testing.T) {
	s := string(initScript)
	for _, want := range []string{
		"#!/bin/sh\n",
		`echo "` + ReadyLine + `"`,
		`PS1='` + Prompt + `'`,
		`echo "` + ModuleFailedPrefix + `$m"`,
		"setsid cttyhack sh",
		"seek=244", // the debug-exit port, 0xf4
		"poweroff -f",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("init.sh lacks %q", want)
		}
	}
}

// cpioEntry is one entry of a newc archive as the kernel reads it.
type cpioEntry struct {
	mode         uint32
	data         []byte // contents, or a link's target
	rdevMajor    uint32
	rdevMinor    uint32
	name         string
	archiveIndex int
}

// readCPIO parses a newc archive into its entries by name, failing t on
// anything the kernel would not unpack.
func readCPIO(t *testing.T, b []byte) map[string]cpioEntry {
	t.Helper()
	out := map[string]cpioEntry{}
	for off, i := 0, 0; ; i++ {
		if off+110 > len(b) || string(b[off:off+6]) != "070701" {
			t.Fatalf("no newc header at offset %d", off)
		}
		field := func(i int) uint32 {
			v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
			if err != nil {
				t.Fatalf("header at %d, field %d: %v", off, i, err)
			}
			return uint32(v)
		}
		mode, size, rmaj, rmin, namesize := field(1), int(field(6)), field(9), field(10), int(field(11))
		if namesize < 1 || off+110+namesize > len(b) {
			t.Fatalf("header at %d: name size %d", off, namesize)
		}
		name := string(b[off+110 : off+110+namesize-1])
		off = (off + 110 + namesize + 3) &^ 3
		if name == "TRAILER!!!" {
			return out
		}
		if off+size > len(b) {
			t.Fatalf("%s: %d bytes past the end", name, size)
		}
		if _, dup := out[name]; dup {
			t.Fatalf("%s twice in the archive", name)
		}
		out[name] = cpioEntry{mode: mode, data: b[off : off+size], rdevMajor: rmaj, rdevMinor: rmin, name: name, archiveIndex: i}
		off = (off + size + 3) &^ 3
	}
}

// resolve follows symbolic links inside the archive's entries to a
// regular file, or returns false.
func resolve(entries map[string]cpioEntry, p string) (cpioEntry, bool) {
	for range 40 {
		e, ok := entries[strings.TrimPrefix(path.Clean(p), "/")]
		if !ok {
			return cpioEntry{}, false
		}
		if e.mode&0o170000 != 0o120000 {
			return e, e.mode&0o170000 == 0o100000
		}
		target := string(e.data)
		if !path.IsAbs(target) {
			target = path.Join(path.Dir("/"+e.name), target)
		}
		p = target
	}
	return cpioEntry{}, false
}

// modinfoDepends reads a module's depends= field.
func modinfoDepends(t *testing.T, name string, ko []byte) []string {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		t.Fatalf("module %s: %v", name, err)
	}
	data, err := f.Section(".modinfo").Data()
	if err != nil {
		t.Fatalf("module %s: .modinfo: %v", name, err)
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok && len(v) > 0 {
			for _, d := range strings.Split(string(v), ",") {
				deps = append(deps, strings.ReplaceAll(d, "-", "_"))
			}
		}
	}
	return deps
}

// TestBuildFromDebianPackages builds the userland from the real packages
// into an empty cache (a download of about 75 MB) and checks the archive
// the kernel will unpack: the modules' closure in dependency order, every
// ELF's loader and libraries present, the applets linked to busybox, and
// the nodes and files /init relies on. A second Build is served from the
// cache.
func TestBuildFromDebianPackages(t *testing.T) {
	for _, tool := range []string{"apt-get", "apt-cache", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("a Debian host is needed (%s: %v)", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cache := t.TempDir()
	var log bytes.Buffer
	f, err := Build(ctx, cache, &log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s%s, %s, packages %v", log.String(), f.KernelPackage, f.Release, f.Packages)
	again, err := Build(ctx, cache, &log)
	if err != nil || fmt.Sprint(again) != fmt.Sprint(f) {
		t.Fatalf("second Build = %+v, %v; want the cached %+v", again, err, f)
	}
	if strings.Count(log.String(), "built the Linux userland") != 1 {
		t.Errorf("the second Build built again:\n%s", log.String())
	}
	bz, err := os.ReadFile(f.Kernel)
	if err != nil || len(bz) < 0x210 || string(bz[0x202:0x206]) != "HdrS" {
		t.Fatalf("kernel %s is not a bzImage (%v)", f.Kernel, err)
	}
	b, err := os.ReadFile(f.Initramfs)
	if err != nil {
		t.Fatal(err)
	}
	entries := readCPIO(t, b)
	t.Logf("initramfs: %d entries, %.1f MiB", len(entries), float64(len(b))/(1<<20))

	t.Run("modules", func(t *testing.T) {
		for _, m := range []string{"virtio", "virtio_ring", "virtio_mmio", "virtio_blk", "virtio_net", "net_failover", "failover", "ext4", "jbd2", "mbcache", "crc16", "crc32c_generic"} {
			if !slices.Contains(f.Modules, m) {
				t.Errorf("module %s missing from %v", m, f.Modules)
			}
		}
		dir := strings.TrimPrefix(ModulesDir(f.Release), "/")
		order, ok := entries[dir+"/order"]
		if !ok || string(order.data) != strings.Join(f.Modules, "\n")+"\n" {
			t.Fatalf("%s/order = %q, want %v one a line", dir, order.data, f.Modules)
		}
		for i, m := range f.Modules {
			ko, ok := entries[dir+"/"+m+".ko"]
			if !ok || !bytes.HasPrefix(ko.data, []byte(elf.ELFMAG)) {
				t.Fatalf("module %s is not an uncompressed ELF .ko in the archive", m)
			}
			for _, d := range modinfoDepends(t, m, ko.data) {
				if j := slices.Index(f.Modules, d); j < 0 || j > i {
					t.Errorf("module %s depends on %s, which loads at %d (it at %d)", m, d, j, i)
				}
			}
		}
	})

	t.Run("every ELF has its loader and libraries", func(t *testing.T) {
		elves := 0
		for name, e := range entries {
			if e.mode&0o170000 != 0o100000 || !bytes.HasPrefix(e.data, []byte(elf.ELFMAG)) || strings.HasSuffix(name, ".ko") {
				continue
			}
			elves++
			ef, err := elf.NewFile(bytes.NewReader(e.data))
			if err != nil {
				t.Errorf("%s: %v", name, err)
				continue
			}
			for _, p := range ef.Progs {
				if p.Type == elf.PT_INTERP {
					interp := make([]byte, p.Filesz)
					p.ReadAt(interp, 0)
					if _, ok := resolve(entries, string(bytes.TrimRight(interp, "\x00"))); !ok {
						t.Errorf("%s: its loader %s is not in the archive", name, interp)
					}
				}
			}
			needed, _ := ef.ImportedLibraries()
			for _, lib := range needed {
				found := false
				for _, d := range []string{"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu"} {
					_, ok := resolve(entries, d+"/"+lib)
					found = found || ok
				}
				if !found {
					t.Errorf("%s needs %s, which is not in the archive", name, lib)
				}
			}
		}
		if elves < len(programs)/2 {
			t.Errorf("only %d ELF files in the archive", elves)
		}
	})

	t.Run("init and its tools", func(t *testing.T) {
		if e := entries["init"]; !bytes.Equal(e.data, initScript) || e.mode != 0o100755 {
			t.Errorf("/init: mode %o, %d bytes; want the script, 0755", e.mode, len(e.data))
		}
		if e := entries["dev/console"]; e.mode != 0o020600 || e.rdevMajor != 5 || e.rdevMinor != 1 {
			t.Errorf("/dev/console = mode %o, %d:%d; want a character device 5:1", e.mode, e.rdevMajor, e.rdevMinor)
		}
		for _, d := range []string{"proc", "sys", "dev", "tmp"} {
			if entries[d].mode&0o170000 != 0o040000 {
				t.Errorf("/%s is not a directory", d)
			}
		}
		for _, applet := range []string{"bin/sh", "bin/cttyhack", "usr/bin/setsid", "sbin/insmod", "bin/mount", "bin/dd", "sbin/poweroff", "bin/dmesg", "usr/bin/sha256sum", "bin/sync"} {
			e, ok := entries[applet]
			if !ok || e.mode != 0o120777 || string(e.data) != busyboxPath {
				t.Errorf("%s is not a link to %s (%o %q)", applet, busyboxPath, e.mode, e.data)
			}
		}
		if e, ok := resolve(entries, busyboxPath); !ok || e.mode&0o111 == 0 {
			t.Errorf("%s is not an executable file", busyboxPath)
		}
		for _, p := range append(programs, configFiles...) {
			if _, ok := resolve(entries, p); !ok {
				t.Errorf("%s is not in the archive", p)
			}
		}
		// e2fsprogs' mkfs.ext4 is the link to mke2fs, not busybox's.
		if e := entries["sbin/mkfs.ext4"]; string(e.data) != "mke2fs" {
			t.Errorf("/sbin/mkfs.ext4 -> %q, want mke2fs", e.data)
		}
	})
}
