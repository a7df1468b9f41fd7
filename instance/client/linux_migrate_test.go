package client_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"tern/instance/apiv1"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
	"tern/vmm/linuxtest"
)

// consoleShell is a Linux shell on an instance's serial websocket: it
// types into the socket and reads lines from it (a consoleWatch), so the
// tests drive a guest through the API as a user's terminal would.
type consoleShell struct {
	*linuxtest.Shell
	w *consoleWatch
}

// wsInput types into a serial websocket.
type wsInput struct{ conn *websocket.Conn }

func (in wsInput) Write(p []byte) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), generous)
	defer cancel()
	if err := in.conn.Write(ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// wsLines reads a consoleWatch's lines.
type wsLines struct{ w *consoleWatch }

func (l wsLines) NextLine(ctx context.Context) (string, error) { return l.w.next(ctx) }

func newConsoleShell(w *consoleWatch) *consoleShell {
	sh := &consoleShell{Shell: linuxtest.NewShell(wsInput{w.conn}, wsLines{w}), w: w}
	sh.Limit = 5 * time.Minute // a command of the emulated host's, with the suite on the same cores
	return sh
}

// waitInGuest is shell text that waits, in the guest, until cond (a
// shell condition) holds or four and a half minutes have passed, within
// the shell's five-minute limit: a guest whose IO stopped still answers the commands
// that show why (guestState).
func waitInGuest(cond string) string {
	return `end=$(($(date +%s)+270)); until ` + cond + ` || [ $(date +%s) -ge $end ]; do usleep 200000; done`
}

// guestState is what the guest says of its disk, its interrupts and its
// kernel's last lines, for a failure message.
func guestState(t *testing.T, sh *consoleShell) string {
	t.Helper()
	return sh.MustRun(t, "cat /sys/block/vda/inflight; grep -i -E 'virtio|ttyS|CPU' /proc/interrupts; dmesg | tail -n 20")
}

// linuxCopyMiB is how much each copy of TestLinuxGuestMigratesMidCopy
// writes: Propolis's migration load test copies 50 MiB.
const linuxCopyMiB = 50

// startCopy starts, in the background, a copy of /tmp/r onto /dev/vda at
// MiB seekMiB, one MiB at a time with O_DIRECT (each reaches the disk
// while it runs, not the page cache) and a pause after each, so the copy
// is still running when the migration pauses the guest; each MiB done is
// a line of /tmp/copied.N, and "done STATUS" ends it.
func startCopy(t *testing.T, sh *consoleShell, n, seekMiB int) {
	t.Helper()
	sh.MustRun(t, fmt.Sprintf(`( i=0; st=0; while [ $i -lt %d ]; do dd if=/tmp/r of=/dev/vda bs=1M count=1 skip=$i seek=$((i+%d)) oflag=direct conv=notrunc 2>/dev/null || { st=$?; break; }; echo $i >>/tmp/copied.%d; usleep 100000; i=$((i+1)); done; echo done $st >>/tmp/copied.%d ) </dev/null >/dev/null 2>&1 &`,
		linuxCopyMiB, seekMiB, n, n))
}

// waitCopied waits for copy n to end and fails t unless all of it was
// written.
func waitCopied(t *testing.T, sh *consoleShell, n int) {
	t.Helper()
	f := fmt.Sprintf("/tmp/copied.%d", n)
	out := sh.MustRun(t, waitInGuest("grep -q '^done' "+f)+"; grep -c -v '^done' "+f+"; grep '^done' "+f+" || true")
	if want := fmt.Sprintf("%d\ndone 0", linuxCopyMiB); out != want {
		t.Fatalf("copy %d ended with %q; want %q (every MiB written); the guest's state:\n%s", n, out, want, guestState(t, sh))
	}
}

// TestLinuxGuestMigratesMidCopy boots Debian's kernel with tern's
// userland, two vCPUs (linuxVCPUs), each kept busy by a counting loop
// pinned to it, and a file disk on one vmm process, then, while the guest
// copies 50 MiB of random data onto its disk, migrates it over QUIC to a
// second process, and, during a second copy, on the same host to a third
// (the memory handed over). Each time the source ends destroyed, its
// console watcher is sent to the target, whose console continues the
// source's, and the guest goes on where it was: the copy completes, the
// data read back from the disk (past the page cache) has the checksum
// written, both CPUs are online and each one's loop counted on after the
// migration, and the clock moved on. One Linux boot; under nested PVM it
// runs in the emulated test host.
func TestLinuxGuestMigratesMidCopy(t *testing.T) {
	kvmtest.Require(t)
	u := linuxtest.Userland(t)
	if linuxtest.UnderNestedPVM() {
		linuxtest.RunInEmulatedHost(t)
		return
	}
	a := startVMM(t, "")
	b := startVMM(t, a.certs)
	c := startVMM(t, a.certs)
	disk := filepath.Join(t.TempDir(), "vda.img")
	if err := os.WriteFile(disk, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(disk, 2*linuxCopyMiB<<20); err != nil {
		t.Fatal(err)
	}
	vcpus := linuxVCPUs
	spec := apiv1.Spec{ID: "linux-mig", VCPUs: vcpus, MemoryMiB: 384,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestLinux, Kernel: u.Kernel, Initrd: u.Initrd, Cmdline: linuxguest.Cmdline},
		Disks: []apiv1.DiskSpec{{Name: "vda", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: disk}}},
		Init:  apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	if _, err := a.client.Ensure(ctx(t), spec); err != nil {
		t.Fatal(err)
	}
	if err := a.client.RequestState(ctx(t), apiv1.Run); err != nil {
		t.Fatal(err)
	}
	sh := newConsoleShell(watchConsole(t, a.client, 0))
	sh.Limit = 8 * time.Minute // the boot: minutes in the emulated host with the suite on the same cores
	boot := time.Now()
	if err := sh.WaitReady(t.Context()); err != nil {
		t.Fatalf("%v; the console's last lines:\n%s", err, sh.Seen())
	}
	t.Logf("ready %.1fs after the run", time.Since(boot).Seconds())
	sh.Limit = 5 * time.Minute
	if cpus := sh.MustRun(t, "grep -c ^processor /proc/cpuinfo"); cpus != fmt.Sprint(vcpus) {
		t.Fatalf("the guest sees %s CPUs, want %d", cpus, vcpus)
	}
	startBusyLoops(t, sh, vcpus)
	sum := sh.MustRun(t, fmt.Sprintf("dd if=/dev/urandom of=/tmp/r bs=1M count=%d 2>/dev/null && sha256sum </tmp/r", linuxCopyMiB))
	checkOnDisk := func(sh *consoleShell, seekMiB int) {
		t.Helper()
		got := sh.MustRun(t, fmt.Sprintf("echo 3 >/proc/sys/vm/drop_caches && dd if=/dev/vda bs=1M skip=%d count=%d iflag=direct 2>/dev/null | sha256sum", seekMiB, linuxCopyMiB))
		if got != sum {
			t.Fatalf("/dev/vda at MiB %d reads back as %q on the target; the guest wrote %q", seekMiB, got, sum)
		}
	}
	migrateMidCopy := func(src, dst *vmmProc, id string, sameHost bool, n, seekMiB int) {
		t.Helper()
		startCopy(t, sh, n, seekMiB)
		// The copy runs; say how far it is as the migration starts.
		t.Logf("copy %d: %s MiB written when %s starts", n, sh.MustRun(t, fmt.Sprintf("cat /tmp/copied.%d 2>/dev/null | wc -l", n)), id)
		before := busyCounts(t, sh, vcpus)
		target := targetSpec(spec.ID, migrationAddr(t, src), id)
		target.Init.SameHost = sameHost
		sh.w.conn.CloseNow() // migrateAndCheck watches the source's console itself
		migrateAndCheck(t, src, dst, target, &history{t: t, name: "source of " + id}, func(w *consoleWatch) string {
			sh = newConsoleShell(w)
			waitCopied(t, sh, n)
			checkOnDisk(sh, seekMiB)
			waitBusyPast(t, sh, before)
			return fmt.Sprintf("copy %d of %d MiB completed on the target with the checksum written; every CPU's loop counted on", n, linuxCopyMiB)
		})
	}
	migrateMidCopy(a, b, "linux-quic", false, 1, 0)
	migrateMidCopy(b, c, "linux-same-host", true, 2, linuxCopyMiB)
	// Both copies, once more, after two migrations; the machine is whole.
	checkOnDisk(sh, 0)
	if cpus, want := sh.MustRun(t, "cat /sys/devices/system/cpu/online"), onlineCPUs(vcpus); cpus != want {
		t.Errorf("after two migrations CPUs %q are online, want %s", cpus, want)
	}
	if up := sh.MustRun(t, "cut -d. -f1 /proc/uptime"); up == "0" || strings.HasPrefix(up, "-") {
		t.Errorf("uptime %q after two migrations", up)
	}
}

// startBusyLoops starts, in the background, a loop pinned to each of the
// guest's n CPUs, reniced to 19 so the shell and the copies still run
// (busybox has renice, not nice): loop i counts, and puts its count in
// /tmp/busy.i every 20,000 rounds (written beside it and renamed over it,
// so a reader never sees it half written).
func startBusyLoops(t *testing.T, sh *consoleShell, n int) {
	t.Helper()
	for i := range n {
		sh.MustRun(t, fmt.Sprintf(`taskset -c %d sh -c 'renice -n 19 -p $$ >/dev/null 2>&1; i=0; while :; do i=$((i+1)); [ $((i %% 20000)) -eq 0 ] && { echo $i >/tmp/busy.%d.t && mv /tmp/busy.%d.t /tmp/busy.%d; }; done' </dev/null >/dev/null 2>&1 &`, i, i, i, i))
	}
	// Each loop has written its file once: every CPU runs its loop.
	sh.MustRun(t, waitInGuest(busyFilesCond(n)))
	if out := sh.MustRun(t, busyFilesCond(n)+" && echo all"); out != "all" {
		t.Fatalf("the busy loops wrote no count within the wait: %q; the guest's state:\n%s", out, guestState(t, sh))
	}
}

// busyFilesCond is a shell condition: every loop's count file exists.
func busyFilesCond(n int) string {
	var c []string
	for i := range n {
		c = append(c, fmt.Sprintf("[ -s /tmp/busy.%d ]", i))
	}
	return strings.Join(c, " && ")
}

// busyCounts returns each busy loop's last written count.
func busyCounts(t *testing.T, sh *consoleShell, n int) []int {
	t.Helper()
	var counts []int
	for i := range n {
		out := sh.MustRun(t, fmt.Sprintf("cat /tmp/busy.%d", i))
		v, err := strconv.Atoi(out)
		if err != nil {
			t.Fatalf("busy loop %d's count %q: %v", i, out, err)
		}
		counts = append(counts, v)
	}
	return counts
}

// waitBusyPast waits, in the guest, until every busy loop's count has
// passed before's, and fails t if one did not: that CPU stopped running
// its loop.
func waitBusyPast(t *testing.T, sh *consoleShell, before []int) {
	t.Helper()
	var c []string
	for i, v := range before {
		c = append(c, fmt.Sprintf("[ $(cat /tmp/busy.%d) -gt %d ]", i, v))
	}
	cond := strings.Join(c, " && ")
	sh.MustRun(t, waitInGuest(cond))
	if out := sh.MustRun(t, cond+" && echo past || cat /tmp/busy.*"); out != "past" {
		t.Fatalf("a CPU's busy loop did not count on after the migration: counts %v before, %q now; the guest's state:\n%s", before, out, guestState(t, sh))
	}
}

// onlineCPUs is /sys/devices/system/cpu/online for a guest of n vCPUs.
func onlineCPUs(n int) string {
	if n == 1 {
		return "0"
	}
	return fmt.Sprintf("0-%d", n-1)
}
