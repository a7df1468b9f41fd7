package migrationcontrol

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"tern/internal/kvmhost"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
	"tern/vmm/linuxtest"
)

// ControlEnv is the number of migrations each VMM is to attempt; unset,
// the tests skip.
const ControlEnv = "TERN_CONTROL_MIGRATIONS"

// The guest both VMMs run: the size of tern's Linux migration test
// (instance/client's TestLinuxGuestMigratesMidCopy).
const (
	guestVCPUs     = 2
	guestMemoryMiB = 384
	diskMiB        = 64
)

// TestMain runs the package in the emulated test host, with two emulated
// CPUs, on every machine: the experiment is about that host. Without
// ControlEnv nothing is prepared and the tests skip.
func TestMain(m *testing.M) {
	if os.Getenv(ControlEnv) == "" && !kvmhost.IsInit() { // the emulated host's init has no environment
		os.Exit(m.Run())
	}
	if !kvmhost.InsideEmulatedHost() {
		os.Setenv(kvmtest.ModeEnv, "always")
	}
	kvmtest.Main(m, kvmtest.WithTern(), kvmtest.WithPrepare(linuxtest.PrepareUserland), kvmtest.WithPrepare(prepareQEMU), kvmtest.WithEmulatedCPUs(2))
}

// migrations returns ControlEnv's count, or skips t saying how to run it.
func migrations(t *testing.T) int {
	t.Helper()
	s := os.Getenv(ControlEnv)
	if s == "" {
		t.Skipf("the control experiment runs only when asked: %s=10 go test -count=1 -v -timeout 150m -run TestControlTern ./instance/migrationcontrol (docs/reliability.md)", ControlEnv)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a number of migrations", ControlEnv, s)
	}
	kvmtest.Require(t)
	if !kvmtest.Inside() {
		t.Fatal("the control experiment runs in the emulated test host only")
	}
	return n
}

// hop is one kind of migration.
type hop int

const (
	network  hop = iota // tern: QUIC; QEMU: tcp on loopback
	sameHost            // tern: memfds handed over; QEMU: a unix socket
)

// hopOf alternates the kinds, the network first.
func hopOf(attempt int) hop { return hop(attempt % 2) }

// failure is one guest failure.
type failure struct {
	// attempt is the migration being made or checked (1-based), or 0
	// for a boot.
	attempt   int
	hop       string
	what      string // "triple fault", "console stopped answering", ...
	signature string // what identifies it: the first lines of a crash report, QEMU's shutdown reason
	detail    string // the whole report and the console's last lines
}

// tally counts one VMM's run.
type tally struct {
	vmm                  string
	attempted, completed int
	// byHop counts attempted and completed migrations of each kind.
	attemptedBy, completedBy map[string]int
	// notCompletedAlive counts migrations that failed with the guest
	// still running on the source.
	notCompletedAlive int
	boots             int
	failures          []failure
	start             time.Time
}

func newTally(vmm string) *tally {
	return &tally{vmm: vmm, attemptedBy: map[string]int{}, completedBy: map[string]int{}, start: time.Now()}
}

func (c *tally) fail(t *testing.T, f failure) {
	t.Helper()
	c.failures = append(c.failures, f)
	t.Logf("control: %s: GUEST FAILURE %d at migration %d (%s): %s: %s\n%s", c.vmm, len(c.failures), f.attempt, f.hop, f.what, f.signature, f.detail)
}

// report logs the counts as `control:` lines.
func (c *tally) report(t *testing.T) {
	t.Helper()
	var hops []string
	for _, h := range []string{c.hopName(network), c.hopName(sameHost)} {
		hops = append(hops, fmt.Sprintf("%s %d/%d", h, c.completedBy[h], c.attemptedBy[h]))
	}
	t.Logf("control: %s: %d migrations attempted, %d completed (%s completed/attempted), %d failed with the guest alive on the source; %d guest failures; %d guest boots; %.0f s",
		c.vmm, c.attempted, c.completed, strings.Join(hops, ", "), c.notCompletedAlive, len(c.failures), c.boots, time.Since(c.start).Seconds())
	for i, f := range c.failures {
		t.Logf("control: %s: failure %d: migration %d (%s): %s: %s", c.vmm, i+1, f.attempt, f.hop, f.what, f.signature)
	}
}

func (c *tally) hopName(h hop) string {
	switch {
	case c.vmm == "tern" && h == network:
		return "quic"
	case c.vmm == "tern":
		return "same-host"
	case h == network:
		return "tcp"
	default:
		return "unix"
	}
}

// The guest's work: a busy loop pinned to each vCPU, and a disk loop
// that writes a 1 MiB block of random data to a slot of /dev/vda
// (O_DIRECT), reads it back past the page cache and compares, then reads
// the slot written in the pass before (on the source, across a
// migration) and compares it with what was written there. It writes its
// pass number to /tmp/disk.pass (renamed into place: a reader never sees
// it empty) and stops at the first mismatch, which
// it names in /tmp/disk.err.
const (
	busyLoops = `for c in 0 1; do taskset -c $c sh -c 'while :; do :; done' </dev/null >/dev/null 2>&1 & done`
	diskLoop  = `( i=0; prev=; while :; do s=$((i % 32)); dd if=/dev/urandom of=/tmp/b bs=64k count=16 2>/dev/null; w=$(sha256sum </tmp/b); ` +
		`dd if=/tmp/b of=/dev/vda bs=1M count=1 seek=$s oflag=direct conv=notrunc 2>/dev/null || { echo "pass $i: writing slot $s failed" >/tmp/disk.err; break; }; ` +
		`r=$(dd if=/dev/vda bs=1M count=1 skip=$s iflag=direct 2>/dev/null | sha256sum); [ "$r" = "$w" ] || { echo "pass $i: slot $s read back $r, written $w" >/tmp/disk.err; break; }; ` +
		`if [ -n "$prev" ]; then p=$(dd if=/dev/vda bs=1M count=1 skip=$ps iflag=direct 2>/dev/null | sha256sum); [ "$p" = "$prev" ] || { echo "pass $i: slot $ps of the pass before read back $p, written $prev" >/tmp/disk.err; break; }; fi; ` +
		`prev=$w; ps=$s; echo $i >/tmp/disk.pass.new; mv /tmp/disk.pass.new /tmp/disk.pass; i=$((i+1)); done ) </dev/null >/dev/null 2>&1 &`
	// kernelTrouble matches what a kernel in trouble logs (the init
	// keeps the console at KERN_EMERG, so they are read with dmesg).
	kernelTrouble = `BUG:|Oops|soft lockup|hard LOCKUP|rcu.*stall|general protection|Kernel panic|WARNING:|segfault|traps:|invalid opcode|double fault`
)

// inGuestWait is shell text that waits in the guest until cond holds or
// four and a half minutes passed, within the shell's five-minute limit.
func inGuestWait(cond string) string {
	return `end=$(($(date +%s)+270)); until ` + cond + ` || [ $(date +%s) -ge $end ]; do usleep 200000; done`
}

// shellLimit bounds one command on the console, bootLimit the boot,
// migrationLimit one migration (tern's QUIC migration of this guest took
// about 90 s in the emulated host, QEMU's under 10 s).
const (
	shellLimit     = 5 * time.Minute
	bootLimit      = 10 * time.Minute
	migrationLimit = 10 * time.Minute
)

// guestProblem is a guest failure seen through its console.
type guestProblem struct {
	what, signature, detail string
}

func (p *guestProblem) Error() string { return p.what + ": " + p.signature }

// consoleStopped is the problem of a console command that did not end.
func consoleStopped(sh *linuxtest.Shell, err error) *guestProblem {
	return &guestProblem{what: "console stopped answering", signature: firstLine(err.Error()), detail: "console's last lines:\n" + sh.Seen()}
}

// bootAndStart waits for the userland on sh, starts the work and returns
// the disk loop's first pass; a failure is the guest's.
func bootAndStart(ctx context.Context, sh *linuxtest.Shell) (int, *guestProblem) {
	sh.Limit = bootLimit
	if err := sh.WaitReady(ctx); err != nil {
		return 0, &guestProblem{what: "boot did not reach " + linuxguest.ReadyLine, signature: firstLine(err.Error()), detail: "console's last lines:\n" + sh.Seen()}
	}
	sh.Limit = shellLimit
	for _, cmd := range []string{"grep -c ^processor /proc/cpuinfo", busyLoops, diskLoop} {
		out, status, err := sh.Run(ctx, cmd)
		if err != nil {
			return 0, consoleStopped(sh, err)
		}
		if status != 0 || cmd == "grep -c ^processor /proc/cpuinfo" && out != strconv.Itoa(guestVCPUs) {
			return 0, &guestProblem{what: "guest set-up failed", signature: fmt.Sprintf("%q: status %d, output %q", cmd, status, out), detail: sh.Seen()}
		}
	}
	return checkGuest(ctx, sh, -1)
}

// checkGuest waits for a disk pass after pass, then checks the disk
// loop found no mismatch, both CPUs are online and the kernel logged
// nothing of kernelTrouble. It returns the pass reached.
func checkGuest(ctx context.Context, sh *linuxtest.Shell, pass int) (int, *guestProblem) {
	cond := fmt.Sprintf("[ -s /tmp/disk.err ] || [ $(cat /tmp/disk.pass 2>/dev/null || echo -1) -gt %d ]", pass)
	out, _, err := sh.Run(ctx, inGuestWait(cond)+"; cat /tmp/disk.pass 2>/dev/null || echo -1")
	if err != nil {
		return 0, consoleStopped(sh, err)
	}
	lines := strings.Split(out, "\n")
	now, err := strconv.Atoi(lines[len(lines)-1])
	if err != nil || len(lines) > 1 {
		return now, &guestProblem{what: "disk loop's pass unreadable", signature: fmt.Sprintf("%q", out), detail: sh.Seen()}
	}
	mismatch, _, err := sh.Run(ctx, "cat /tmp/disk.err 2>/dev/null || true")
	if err != nil {
		return now, consoleStopped(sh, err)
	}
	if mismatch != "" {
		return now, &guestProblem{what: "disk readback mismatch", signature: mismatch, detail: sh.Seen()}
	}
	if now <= pass {
		return now, &guestProblem{what: "disk loop made no pass", signature: fmt.Sprintf("pass %d after 270 s (was %d)", now, pass), detail: sh.Seen()}
	}
	online, _, err := sh.Run(ctx, "cat /sys/devices/system/cpu/online")
	if err != nil {
		return now, consoleStopped(sh, err)
	}
	if want := fmt.Sprintf("0-%d", guestVCPUs-1); online != want {
		return now, &guestProblem{what: "CPUs offline", signature: fmt.Sprintf("online %q, want %q", online, want), detail: sh.Seen()}
	}
	kern, _, err := sh.Run(ctx, "dmesg | grep -E '"+kernelTrouble+"' | head -n 40")
	if err != nil {
		return now, consoleStopped(sh, err)
	}
	if kern != "" {
		full, _, _ := sh.Run(ctx, "dmesg | tail -n 80")
		return now, &guestProblem{what: "kernel trouble", signature: firstLine(kern), detail: kern + "\n-- dmesg tail --\n" + full}
	}
	return now, nil
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}

// lastLines returns s's last n lines.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
