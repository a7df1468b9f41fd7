package client_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"tern/instance/apiv1"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
	"tern/vmm/linuxtest"
	"tern/volume/extent"
	"tern/volume/ids"
)

// TestLinuxGuestOnAVolumeSurvivesADownstairsKillAndBootsAgainAtAHigherGeneration
// runs Debian's kernel with tern's userland and two vCPUs on a volume of
// three `tern downstairs` processes: the guest sees its CPUs and
// /dev/vda, makes an ext4 on it and copies 12 MiB of random data onto it
// (O_DIRECT, a MiB at a time); a downstairs is SIGKILLed in the middle of
// the copy, which completes without an IO error (no "I/O error" in the
// kernel's log); after a sync the file's checksum is the data's and, once
// unmounted, e2fsck -fn finds the file system clean. The killed downstairs
// restarts where it listened and is repaired back to active, and the
// guest powers off (the instance stops saying so). A second VM on another
// vmm process, at the next generation, mounts the file system and reads
// the same checksum; afterwards the three regions are block-for-block the
// same. Two Linux boots; under nested PVM it runs in the emulated test
// host.
// linuxVCPUs is the vCPUs of the Linux guests that do IO while they are
// checked (the volume test's, the migration test's), everywhere they run:
// two, so that SMP is what is proven (docs/reliability.md has the history
// of two-vCPU guests in the emulated test host).
const linuxVCPUs = 2

func TestLinuxGuestOnAVolumeSurvivesADownstairsKillAndBootsAgainAtAHigherGeneration(t *testing.T) {
	kvmtest.Require(t)
	u := linuxtest.Userland(t)
	if linuxtest.UnderNestedPVM() {
		linuxtest.RunInEmulatedHost(t)
		return
	}
	const (
		blockSize   = 4096
		extentBlock = 256 // 1 MiB extents
		extents     = 32  // a 32 MiB volume
		copyMiB     = 12
	)
	certs, dirs, procs, addrs := startDownstairsProcs(t, t.TempDir(),
		"--block-size", strconv.Itoa(blockSize), "--extent-size", "1MiB", "--extent-count", strconv.Itoa(extents))
	wait := uint64(60_000)
	vcpus := linuxVCPUs
	specAt := func(gen ids.Generation) apiv1.Spec {
		return apiv1.Spec{ID: "linux-vol", VCPUs: vcpus, MemoryMiB: 256,
			Guest: apiv1.GuestSpec{Kind: apiv1.GuestLinux, Kernel: u.Kernel, Initrd: u.Initrd, Cmdline: linuxguest.Cmdline},
			Disks: []apiv1.DiskSpec{{Name: "vol", Backend: apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: addrs,
				Region: &apiv1.RegionSpec{BlockSize: blockSize, ExtentBlocks: extentBlock, ExtentCount: extents}, Gen: gen, QuorumWaitMs: &wait}}},
			Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	}
	boot := func(p *vmmProc, gen ids.Generation) *consoleShell {
		t.Helper()
		if _, err := p.client.Ensure(ctx(t), specAt(gen)); err != nil {
			t.Fatal(err)
		}
		if err := p.client.RequestState(ctx(t), apiv1.Run); err != nil {
			t.Fatal(err)
		}
		sh := newConsoleShell(watchConsole(t, p.client, 0))
		sh.Limit = 8 * time.Minute // activation and the boot, in the emulated host with the suite on the same cores
		start := time.Now()
		if err := sh.WaitReady(t.Context()); err != nil {
			t.Fatalf("%v; the console's last lines:\n%s", err, sh.Seen())
		}
		t.Logf("generation %d: ready %.1fs after the run", gen, time.Since(start).Seconds())
		sh.Limit = 5 * time.Minute
		return sh
	}

	a := startVMM(t, certs)
	sh := boot(a, 1)
	if cpus, want := sh.MustRun(t, "cat /sys/devices/system/cpu/online"), onlineCPUs(vcpus); cpus != want {
		t.Fatalf("the guest has CPUs %q online, want %s", cpus, want)
	}
	if sectors := sh.MustRun(t, "cat /sys/block/vda/size"); sectors != strconv.Itoa(extents*extentBlock*blockSize/512) {
		t.Fatalf("/dev/vda has %s sectors, want the volume's %d", sectors, extents*extentBlock*blockSize/512)
	}
	sum := sh.MustRun(t, fmt.Sprintf("dd if=/dev/urandom of=/tmp/r bs=1M count=%d 2>/dev/null && sha256sum </tmp/r", copyMiB))
	sh.MustRun(t, "mkfs.ext4 -q -F /dev/vda && mkdir -p /mnt && mount /dev/vda /mnt")
	sh.MustRun(t, fmt.Sprintf(`( i=0; st=0; while [ $i -lt %d ]; do dd if=/tmp/r of=/mnt/r bs=1M count=1 skip=$i seek=$i oflag=direct conv=notrunc 2>/tmp/dd.err || { st=$?; break; }; echo $i >>/tmp/copied; usleep 100000; i=$((i+1)); done; echo done $st >>/tmp/copied ) </dev/null >/dev/null 2>&1 &`, copyMiB))
	// Kill a downstairs once a few MiB are written: the rest of the copy
	// runs on two replicas. A copy that ended first, or wrote less within
	// waitInGuest's bound, fails the test with the guest's view of its disk and
	// interrupts.
	progress := sh.MustRun(t, waitInGuest(`[ $(cat /tmp/copied 2>/dev/null | wc -l) -ge 3 ] || grep -q '^done' /tmp/copied 2>/dev/null`)+`; cat /tmp/copied 2>/dev/null | tr '\n' ' '`)
	if f := strings.Fields(progress); len(f) < 3 || slices.Contains(f, "done") {
		t.Fatalf("before the kill the copy wrote %q (the MiB copied, then \"done\" and its status if it ended); dd said %q; the guest's state:\n%s",
			progress, sh.MustRun(t, "cat /tmp/dd.err"), guestState(t, sh))
	}
	const victim = 1
	procs[victim].Kill()
	t.Logf("downstairs %d killed with %s MiB copied", victim, sh.MustRun(t, "cat /tmp/copied | wc -l"))
	out := sh.MustRun(t, waitInGuest("grep -q '^done' /tmp/copied")+`; grep -c -v '^done' /tmp/copied; grep '^done' /tmp/copied; dmesg | grep -c 'I/O error' || true`)
	if want := fmt.Sprintf("%d\ndone 0\n0", copyMiB); out != want {
		t.Fatalf("the copy with a downstairs killed ended with %q (MiB copied, its status, I/O errors in the kernel's log); want %q; dd said %q; the guest's state:\n%s",
			out, want, sh.MustRun(t, "cat /tmp/dd.err"), guestState(t, sh))
	}
	if got := sh.MustRun(t, "sync && echo 3 >/proc/sys/vm/drop_caches && sha256sum </mnt/r"); got != sum {
		t.Fatalf("/mnt/r hashes to %q, the data to %q", got, sum)
	}
	if fsck := sh.MustRun(t, "umount /mnt && e2fsck -fn /dev/vda >/tmp/fsck 2>&1; echo $?"); fsck != "0" {
		t.Fatalf("e2fsck -fn after the kill: status %s:\n%s", fsck, sh.MustRun(t, "cat /tmp/fsck"))
	}
	// The killed downstairs comes back where it listened and is repaired.
	procs[victim] = kvmtest.StartDownstairsAt(t, dirs[victim], certs, addrs[victim])
	wctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	waitDisk(t, wctx, a.client, "the restarted replica to be repaired", func(d apiv1.DiskStatus) bool {
		return len(d.Replicas) == 3 && d.Replicas[victim].State == "active"
	})
	if err := sh.Type("poweroff -f"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.client.WaitFor(wctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
		t.Fatal(err)
	}
	if v, err := a.client.Get(ctx(t)); err != nil || v.StopReason != "guest powered off" {
		t.Fatalf("after poweroff -f: %+v, %v; want stop_reason %q", v, err, "guest powered off")
	}

	// A new VM at the next generation finds the file.
	b := startVMM(t, certs)
	sh = boot(b, 2)
	if got := sh.MustRun(t, "mkdir -p /mnt && mount /dev/vda /mnt && sha256sum </mnt/r"); got != sum {
		t.Fatalf("at generation 2 /mnt/r hashes to %q, written %q", got, sum)
	}
	if fsck := sh.MustRun(t, "umount /mnt && e2fsck -fn /dev/vda >/tmp/fsck 2>&1; echo $?"); fsck != "0" {
		t.Fatalf("e2fsck -fn at generation 2: status %s:\n%s", fsck, sh.MustRun(t, "cat /tmp/fsck"))
	}
	if err := sh.Type("poweroff -f"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.client.WaitFor(wctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
		t.Fatal(err)
	}
	// The replicas agree block for block, the repaired one included.
	var sums [3][32]byte
	for i, p := range procs {
		p.Stop()
		r, err := extent.Open(dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		h := sha256.New()
		buf := make([]byte, extentBlock*blockSize)
		for e := range extents {
			if err := r.ReadBlocks(ids.BlockIndex(e*extentBlock), buf, make([]uint64, extentBlock)); err != nil {
				r.Close()
				t.Fatalf("reading replica %d extent %d: %v", i, e, err)
			}
			h.Write(buf)
		}
		r.Close()
		copy(sums[i][:], h.Sum(nil))
	}
	if !bytes.Equal(sums[0][:], sums[1][:]) || !bytes.Equal(sums[0][:], sums[2][:]) {
		t.Fatalf("the replicas differ: %x %x %x", sums[0], sums[1], sums[2])
	}
}
