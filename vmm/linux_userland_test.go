package vmm_test

import (
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"tern/internal/blockio"
	"tern/vmm"
	"tern/vmm/devices"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
	"tern/vmm/linuxtest"
)

// TestLinuxUserlandRunsItsShell boots Debian's bzImage with tern's Linux
// userland (vmm/linuxguest) once, quiet: its modules load, its shell on
// the console runs commands with their output and status (the kernel's
// release, e2fsprogs making and checking a file system on a file in
// /tmp, one CPU), and the shell's exit status ends Run through port 0xf4.
// The same boot has a file disk, which the kernel finds in the ACPI DSDT
// as /dev/vda and drives through tern's irqfd and ioeventfds
// (virtio_irq.go): random data written with an fsync is in the file, with
// the backend flushed, and reads back with the same checksum; an ext4
// made on it checks clean. Under nested PVM it runs itself again in the
// emulated test host.
func TestLinuxUserlandRunsItsShell(t *testing.T) {
	kvmtest.Require(t)
	u := linuxtest.Userland(t)
	if linuxtest.UnderNestedPVM() {
		linuxtest.RunInEmulatedHost(t)
		return
	}
	const diskBytes, dataBytes = 64 << 20, 4 << 20
	diskPath := filepath.Join(t.TempDir(), "vda.img")
	if err := os.WriteFile(diskPath, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(diskPath, diskBytes); err != nil {
		t.Fatal(err)
	}
	file, err := devices.OpenFileBackend(diskPath, 512)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { file.Close() })
	disk := &recordingBackend{Device: file}
	vm := newVM(t, vmm.Config{
		Linux:       &vmm.LinuxGuest{Kernel: u.Kernel, Initrd: u.Initrd, Cmdline: linuxguest.Cmdline},
		MemoryBytes: 256 << 20,
		Disks:       []blockio.Device{disk},
	})
	sh := linuxtest.NewUARTShell(vm.Serial())
	defer sh.Close()
	done := startWithin(t, vm, 2*linuxBoot())
	sh.Limit = linuxBoot()
	start := time.Now()
	if err := sh.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("ready after %.1fs", time.Since(start).Seconds())
	sh.Limit = kvmtest.Sized(generous, 4*time.Minute)
	for _, c := range []struct {
		cmd   string
		check func(out string) bool
		want  string
	}{
		{"uname -r", func(out string) bool { return out == u.Release }, u.Release},
		{"mkfs.ext4 -V", func(out string) bool { return strings.HasPrefix(out, "mke2fs 1.") }, "mke2fs's version"},
		{"cat /proc/cpuinfo | grep -c processor", func(out string) bool { return out == "1" }, "1"},
		{"grep -c -e '^virtio_mmio ' -e '^virtio_blk ' -e '^virtio_net ' -e '^ext4 ' /proc/modules", func(out string) bool { return out == "4" }, "4 modules loaded"},
		{"dd if=/dev/zero of=/tmp/fs bs=1M count=8 2>/dev/null && mkfs.ext4 -q -F /tmp/fs && e2fsck -fn /tmp/fs >/dev/null 2>&1 && echo clean", func(out string) bool { return out == "clean" }, "clean"},
	} {
		out, status, err := sh.Run(t.Context(), c.cmd)
		if err != nil {
			t.Fatal(err)
		}
		if status != 0 || !c.check(out) {
			t.Errorf("%s: status %d, output %q; want 0 and %s", c.cmd, status, out, c.want)
		}
	}
	// The disk: its size, random data written through an fsync (FLUSH)
	// and read back past the page cache, then ext4 on it.
	run := func(cmd string) string {
		t.Helper()
		return sh.MustRun(t, cmd)
	}
	if out := run("cat /sys/block/vda/size"); out != fmt.Sprint(diskBytes/512) {
		t.Errorf("/sys/block/vda/size = %q, want %d sectors", out, diskBytes/512)
	}
	sum := run(fmt.Sprintf("dd if=/dev/urandom of=/tmp/r bs=1M count=%d 2>/dev/null && dd if=/tmp/r of=/dev/vda bs=1M conv=fsync 2>/dev/null && sha256sum </tmp/r", dataBytes>>20))
	disk.mu.Lock()
	flushes := disk.flushes
	disk.mu.Unlock()
	if flushes == 0 {
		t.Errorf("the guest's fsync of /dev/vda returned with no FLUSH reaching the backend")
	}
	onDisk, err := os.ReadFile(diskPath)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprintf("%x  -", sha256.Sum256(onDisk[:dataBytes])); got != sum {
		t.Errorf("the disk file's first %d bytes hash to %q; the guest wrote %q", dataBytes, got, sum)
	}
	if back := run(fmt.Sprintf("echo 3 >/proc/sys/vm/drop_caches && dd if=/dev/vda bs=1M count=%d 2>/dev/null | sha256sum", dataBytes>>20)); back != sum {
		t.Errorf("/dev/vda reads back as %q, written %q", back, sum)
	}
	if out := run("mkfs.ext4 -q -F /dev/vda && mkdir -p /mnt && mount /dev/vda /mnt && cp /tmp/r /mnt/r && sync && umount /mnt && e2fsck -fn /dev/vda >/dev/null 2>&1 && echo clean"); out != "clean" {
		t.Errorf("ext4 on /dev/vda: %q, want clean", out)
	}
	t.Logf("the disk's interrupt: %s", run("grep virtio /proc/interrupts || true"))
	if _, status, err := sh.Run(t.Context(), "ls /nonexistent 2>/dev/null"); err != nil || status == 0 {
		t.Errorf("ls /nonexistent: status %d, %v; want a failure", status, err)
	}
	if err := sh.Type("exit 3"); err != nil {
		t.Fatal(err)
	}
	if r := wait(t, done); r.err != nil || r.status != 3 {
		t.Fatalf("Run = %d, %v; want 3, nil (the shell's exit status through port 0xf4); the console's last lines:\n%s", r.status, r.err, sh.Seen())
	}
}
