package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tern/internal/kvmhost"
	"tern/vmm/guests"
	"tern/vmm/linuxguest"
)

func TestGuestsBuildWritesEveryEmbeddedGuest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "dir")
	stdout, stderr, code := runTern(t, "guests", "build", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, name := range guests.Names() {
		path := filepath.Join(dir, name+".elf")
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := guests.ELF(name)
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the embedded guest", path)
		}
		if !strings.Contains(stdout, path+"\n") {
			t.Errorf("stdout %q does not list %s", stdout, path)
		}
	}
}

func TestGuestsBuildWithoutOutFails(t *testing.T) {
	_, stderr, code := runTern(t, "guests", "build")
	if code == 0 || !strings.Contains(stderr, "--out") {
		t.Errorf("exit %d stderr %q, want a failure naming --out", code, stderr)
	}
}

func TestGuestsLinuxWithoutOutFails(t *testing.T) {
	_, stderr, code := runTern(t, "guests", "linux")
	if code == 0 || !strings.Contains(stderr, "--out") {
		t.Errorf("exit %d stderr %q, want a failure naming --out", code, stderr)
	}
}

// TestGuestsLinuxWritesKernelAndInitramfs builds the Linux guest into the
// tests' shared kernel cache (as the Linux boot tests do) and checks the
// two files and the command it prints.
func TestGuestsLinuxWritesKernelAndInitramfs(t *testing.T) {
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skipf("a Debian host is needed: %v", err)
	}
	cache, err := kvmhost.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "linux")
	stdout, stderr, code := runTern(t, "guests", "linux", "--out", dir, "--cache", filepath.Join(cache, "linuxguest"))
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	kernel, initrd := filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs")
	bz, err := os.ReadFile(kernel)
	if err != nil || len(bz) < 0x210 || string(bz[0x202:0x206]) != "HdrS" {
		t.Errorf("%s is not a bzImage (%v)", kernel, err)
	}
	if b, err := os.ReadFile(initrd); err != nil || !bytes.HasPrefix(b, []byte("070701")) {
		t.Errorf("%s is not a newc cpio archive (%v)", initrd, err)
	}
	want := "tern vmm run --kernel " + kernel + " --initrd " + initrd + " --cmdline '" + linuxguest.Cmdline + "'"
	if !strings.Contains(stdout, want) {
		t.Errorf("stdout %q lacks the command %q", stdout, want)
	}
}
