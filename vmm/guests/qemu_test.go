package guests

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// These tests run the committed guests under QEMU through the PVH entry:
// under TCG (software emulation, no KVM needed) they prove the guests
// themselves (CPL0 set-up and the drop to CPL3, exception handler, UART
// output and input, exit port, virtio-blk driver, dirty pattern), not
// tern; under KVM, when /dev/kvm is usable, they also run hello and dirty
// and log dirty's figures. tern's own KVM tests come with the VMM.

// tcg and kvm are the accelerator arguments.
var (
	tcg = []string{"-accel", "tcg"}
	kvm = []string{"-enable-kvm"}
)

// qemuGuest is a running QEMU with one guest: its serial output arrives
// line by line, and its standard input is the UART's input.
type qemuGuest struct {
	t      *testing.T
	name   string
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	lines  chan string // serial lines without CR LF; closed when QEMU's stdout is
	out    strings.Builder
	ctx    context.Context
	kvm    bool
}

// startQEMU boots guest under `qemu-system-x86_64 -M microvm` with the
// given accelerator, an isa-debug-exit device at 0xf4, the UART on
// standard input and output, and the parameter block p when it is not nil.
// QEMU is killed at the end of the test if it is still running.
func startQEMU(t *testing.T, accel []string, guest string, p *Params, extra ...string) *qemuGuest {
	t.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86): cannot run the guests")
	}
	b, err := ELF(guest)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, guest+".elf")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if p != nil {
		params := filepath.Join(dir, "params.bin")
		if err := os.WriteFile(params, p.Encode(), 0o644); err != nil {
			t.Fatal(err)
		}
		extra = append(extra, "-device", fmt.Sprintf("loader,file=%s,addr=%#x,force-raw=on", params, ParamsAddr))
	}
	// Generous for TCG on a loaded machine: only a hung guest waits it out.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	t.Cleanup(cancel)
	args := append(append(QEMUMachineArgs(), accel...), "-m", "512M",
		"-nodefaults", "-no-reboot", "-nographic", "-display", "none", "-serial", "stdio",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04", "-kernel", path)
	g := &qemuGuest{t: t, name: guest, lines: make(chan string, 64), ctx: ctx, kvm: accel[0] == kvm[0]}
	g.cmd = exec.CommandContext(ctx, qemu, append(args, extra...)...)
	g.cmd.Stderr = &g.stderr
	if g.stdin, err = g.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := g.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := g.cmd.Start(); err != nil {
		t.Fatalf("starting qemu: %v", err)
	}
	read := make(chan struct{})
	go func() { // owned by the test: ends when QEMU's stdout closes
		defer close(read)
		defer close(g.lines)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			g.lines <- strings.TrimSuffix(s.Text(), "\r")
		}
	}()
	t.Cleanup(func() {
		cancel() // kills QEMU if it is still running
		for range g.lines {
		}
		<-read
		_ = g.cmd.Wait()
	})
	return g
}

// next returns the next serial line; ok is false once QEMU's output ended.
// It fails the test at the deadline.
func (g *qemuGuest) next() (line string, ok bool) {
	g.t.Helper()
	select {
	case line, ok = <-g.lines:
		if ok {
			g.out.WriteString(line + "\n")
		}
		return line, ok
	case <-g.ctx.Done():
		g.t.Fatalf("guest %s: no output before the deadline; serial so far:\n%s", g.name, g.out.String())
		return "", false
	}
}

// waitFor returns the first serial line that match accepts, failing the
// test if QEMU's output ends first.
func (g *qemuGuest) waitFor(match func(line string) bool) string {
	g.t.Helper()
	for {
		line, ok := g.next()
		if !ok {
			_ = g.cmd.Wait()
			g.skipIfKVMRefused()
			g.t.Fatalf("guest %s ended without the line it waited for; serial:\n%s\nstderr: %s",
				g.name, g.out.String(), g.stderr.String())
		}
		if match(line) {
			return line
		}
	}
}

// wait reads the rest of the serial output and returns it and QEMU's exit
// status.
func (g *qemuGuest) wait() (string, int) {
	g.t.Helper()
	for {
		if _, ok := g.next(); !ok {
			break
		}
	}
	err := g.cmd.Wait()
	if g.ctx.Err() != nil {
		g.t.Fatalf("guest %s did not exit within the deadline; serial:\n%s", g.name, g.out.String())
	}
	g.skipIfKVMRefused()
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		g.t.Fatalf("running qemu: %v\n%s", err, g.stderr.String())
	}
	if g.stderr.Len() > 0 {
		g.t.Logf("qemu stderr: %s", g.stderr.String())
	}
	return g.out.String(), code
}

// qemuRun boots guest under TCG and returns its serial output (LF line
// ends) and QEMU's exit status.
func qemuRun(t *testing.T, guest string, p *Params, extra ...string) (string, int) {
	t.Helper()
	return startQEMU(t, tcg, guest, p, extra...).wait()
}

// qemuStatus is QEMU's exit status when the guest wrote status to the
// isa-debug-exit port: (status<<1)|1.
func qemuStatus(status uint8) int { return int(status)<<1 | 1 }

// qemuExitSuccess is QEMU's exit status for guest status 0.
var qemuExitSuccess = qemuStatus(0)

func TestQEMUHelloPrintsAndExitsZero(t *testing.T) {
	forEachAccel(t, func(t *testing.T, accel []string) {
		out, code := startQEMU(t, accel, "hello", nil).wait()
		if out != HelloLine+"\n" {
			t.Errorf("serial output %q, want exactly the hello line", out)
		}
		if code != qemuExitSuccess {
			t.Errorf("qemu exit status %d, want %d (guest status 0)", code, qemuExitSuccess)
		}
	})
}

func TestQEMUExceptionAtCPL3IsReportedAndExitsWithItsVector(t *testing.T) {
	forEachAccel(t, testExceptions)
}

func testExceptions(t *testing.T, accel []string) {
	for _, c := range []struct {
		name   string
		fault  uint64
		vector uint8
		line   string
	}{
		{"divide", HelloFaultDivide, 0, `^guest: exception #DE vector 0 error 0x0 rip 0x[0-9a-f]+ cpl 3$`},
		{"ud2", HelloFaultInvalidOp, 6, `^guest: exception #UD vector 6 error 0x0 rip 0x[0-9a-f]+ cpl 3$`},
		{"non-canonical", HelloFaultNonCanonical, 13, `^guest: exception #GP vector 13 error 0x0 rip 0x[0-9a-f]+ cpl 3$`},
		{"unmapped", HelloFaultPage, 14, `^guest: exception #PF vector 14 error 0x4 rip 0x[0-9a-f]+ cpl 3 cr2 0x100000000$`},
		{"denied-port", HelloFaultPort, 13, `^guest: exception #GP vector 13 error 0x0 rip 0x[0-9a-f]+ cpl 3$`},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			out, code := startQEMU(t, accel, "hello", &Params{HelloFault: c.fault}).wait()
			lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
			if len(lines) != 2 || lines[0] != HelloLine || !regexp.MustCompile(c.line).MatchString(lines[1]) {
				t.Errorf("serial output %q, want the hello line and one matching %q", out, c.line)
			}
			if want := qemuStatus(ExceptionStatus(c.vector)); code != want {
				t.Errorf("qemu exit status %d, want %d (guest status %#x)", code, want, ExceptionStatus(c.vector))
			}
		})
	}
}

func TestQEMUEchoEchoesUARTInputUntilQuit(t *testing.T) {
	forEachAccel(t, func(t *testing.T, accel []string) {
		g := startQEMU(t, accel, "echo", nil)
		g.waitFor(func(line string) bool { return line == EchoReady })
		// CR LF, bare LF and bare CR all end a line; CR LF counts once.
		if _, err := io.WriteString(g.stdin, "hello tern\r\nsecond line\nthird\r\rquit\n"); err != nil {
			t.Fatal(err)
		}
		out, code := g.wait()
		want := EchoReady + "\necho: hello tern\necho: second line\necho: third\necho: \necho: quit\n" + EchoBye + "\n"
		if out != want {
			t.Errorf("serial output %q, want %q", out, want)
		}
		if code != qemuExitSuccess {
			t.Errorf("qemu exit status %d, want %d", code, qemuExitSuccess)
		}
	})
}

func TestQEMUDiskWritesVerifiesAndLeavesThePatternOnTheImage(t *testing.T) {
	forEachAccel(t, testDisk)
}

// testDisk runs the disk guest from CPL3 against QEMU's virtio-blk and
// checks the image afterwards.
func testDisk(t *testing.T, accel []string) {
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := startQEMU(t, accel, "disk", nil,
		"-global", "virtio-mmio.force-legacy=false",
		"-drive", "id=d0,file="+img+",format=raw,if=none",
		"-device", "virtio-blk-device,drive=d0,serial=terndisk0").wait()
	if !strings.Contains(out, "disk: id terndisk0\n") || !strings.Contains(out, "disk: PASS 256 sectors\n") {
		t.Errorf("serial output %q, want the disk id and PASS", out)
	}
	if code != qemuExitSuccess {
		t.Errorf("qemu exit status %d, want %d", code, qemuExitSuccess)
	}
	data, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	for s := uint64(0); s < 256; s++ {
		if !bytes.Equal(data[s*512:(s+1)*512], DiskPattern(DefaultDiskSeed, s)) {
			t.Fatalf("sector %d of the image does not hold the guest's pattern", s)
		}
	}
	if !bytes.Equal(data[256*512:], make([]byte, len(data)-256*512)) {
		t.Error("the guest wrote past the sectors it was asked to write")
	}
}

func TestQEMUDiskWithoutDeviceFails(t *testing.T) {
	out, code := qemuRun(t, "disk", nil)
	if !strings.Contains(out, "disk: FAIL no virtio-blk device") || code != qemuStatus(2) {
		t.Errorf("output %q status %d, want the no-device failure and guest status 2", out, code)
	}
}

func TestQEMUDirtyHonoursParamsAndVerifies(t *testing.T) {
	p := Params{MemStart: 8 << 20, MemBytes: 4 << 20, WorkingSetBytes: 256 << 10, Passes: 3, TSCkHz: 1_000_000}
	out, code := qemuRun(t, "dirty", &p)
	for _, want := range []string{
		"dirty: 1024 pages at 0x800000, working set 64 pages\n",
		"dirty: tsc 1000000 kHz\n",
		"dirty: verify PASS generation 3\ndirty: verified 4 MiB in ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("serial output %q lacks %q", out, want)
		}
	}
	for _, re := range []string{`\ndirty: filled 4 MiB in [0-9]+ ms\n`, `\ndirty: rate [0-9]+ MiB/s\n`,
		`\ndirty: max progress gap [0-9]+ tsc ticks\n$`} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("serial output %q does not match %q", out, re)
		}
	}
	if strings.Contains(out, "FAIL") {
		t.Errorf("serial output %q reports a failure", out)
	}
	if code != qemuExitSuccess {
		t.Errorf("qemu exit status %d, want %d", code, qemuExitSuccess)
	}
}

func TestQEMUDirtyForeverVerifiesPeriodicallyAndPrintsItsRate(t *testing.T) {
	// A small TSC frequency makes the interval short in wall-clock time.
	p := Params{MemBytes: 2 << 20, WorkingSetBytes: 1 << 20, Passes: PassesForever, TSCkHz: 200_000}
	g := startQEMU(t, tcg, "dirty", &p)
	for i := 0; i < 2; i++ {
		g.waitFor(func(line string) bool { _, ok := ParseDirtyRate(line); return ok })
		// Before each verification, the interval's largest gap, however
		// short.
		line := g.waitFor(func(line string) bool {
			_, gap := ParseDirtyLargestGap(line)
			_, verify := ParseDirtyVerify(line)
			return gap || verify
		})
		if _, ok := ParseDirtyLargestGap(line); !ok {
			t.Fatalf("interval %d: %q before its largest gap", i, line)
		}
		line = g.waitFor(func(line string) bool { _, ok := ParseDirtyVerify(line); return ok })
		if v, _ := ParseDirtyVerify(line); !v.Pass {
			t.Fatalf("periodic verification %d: %q", i, line)
		}
	}
}

func TestQEMUDirtyIdleVerifiesEachIntervalAndDirtiesNothing(t *testing.T) {
	// A small TSC frequency makes the intervals short in wall-clock time.
	p := Params{MemBytes: 2 << 20, WorkingSetBytes: 1 << 20, Passes: 3, TSCkHz: 200_000, Idle: true}
	out, code := qemuRun(t, "dirty", &p)
	if !strings.Contains(out, "\ndirty: idle, dirtying nothing\n") {
		t.Errorf("serial output %q lacks the idle line", out)
	}
	// Every interval ends in "rate 0" and a verification of generation 0:
	// nothing was rewritten after the fill.
	if n := strings.Count(out, "\ndirty: rate 0 MiB/s\ndirty: verify PASS generation 0\ndirty: verified 2 MiB in "); n != 3 {
		t.Errorf("serial output %q has %d intervals ending in a PASS of generation 0, want 3", out, n)
	}
	if !regexp.MustCompile(`\ndirty: max progress gap [0-9]+ tsc ticks\n$`).MatchString(out) {
		t.Errorf("serial output %q does not end with the longest gap", out)
	}
	if strings.Contains(out, "FAIL") || regexp.MustCompile(`dirty: rate [1-9]`).MatchString(out) {
		t.Errorf("serial output %q reports a failure or a rate above 0", out)
	}
	if code != qemuExitSuccess {
		t.Errorf("qemu exit status %d, want %d", code, qemuExitSuccess)
	}
}

// kvmUsable skips the test unless /dev/kvm can be opened for reading and
// writing.
func kvmUsable(t *testing.T) {
	t.Helper()
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	f.Close()
}

// skipIfKVMRefused skips the test when QEMU could not use KVM, which shows
// as no serial output and a complaint that names KVM on stderr.
func (g *qemuGuest) skipIfKVMRefused() {
	g.t.Helper()
	if g.kvm && g.out.Len() == 0 && strings.Contains(strings.ToLower(g.stderr.String()), "kvm") {
		g.t.Skipf("qemu could not use KVM: %s", g.stderr.String())
	}
}

// forEachAccel runs f under TCG and, when /dev/kvm is usable, under KVM.
func forEachAccel(t *testing.T, f func(t *testing.T, accel []string)) {
	t.Run("tcg", func(t *testing.T) { f(t, tcg) })
	t.Run("kvm", func(t *testing.T) {
		kvmUsable(t)
		f(t, kvm)
	})
}

func TestQEMUKVMDirtyVerifies256MiB(t *testing.T) {
	kvmUsable(t)
	p := Params{MemStart: 16 << 20, MemBytes: 256 << 20, WorkingSetBytes: 64 << 20, Passes: 8}
	g := startQEMU(t, kvm, "dirty", &p)
	out, code := g.wait()
	if !strings.Contains(out, "dirty: verify PASS generation 8\n") || strings.Contains(out, "FAIL") || code != qemuExitSuccess {
		t.Errorf("output %q status %d, want a PASS of generation 8 and status %d", out, code, qemuExitSuccess)
	}
	t.Logf("dirty under KVM (figures scaled by an assumed %d kHz TSC):\n%s", DefaultTSCkHz, out)
}

// demoDiskArgs are QEMU's arguments for a modern virtio-blk device on the
// raw image img with the given serial (the guest's GET_ID string).
func demoDiskArgs(img, serial string) []string {
	return []string{"-global", "virtio-mmio.force-legacy=false",
		"-drive", "id=d0,file=" + img + ",format=raw,if=none",
		"-device", "virtio-blk-device,drive=d0,serial=" + serial}
}

// demoTSCkHz is far below any real TSC frequency, so that demo's
// one-second rounds come several times a wall-clock second.
const demoTSCkHz = 250_000

// waitDemoRounds reads demo's serial output until n more status lines
// that match want have arrived, failing the test on a status line that
// does not.
func (g *qemuGuest) waitDemoRounds(n int, want func(DemoRound) bool) {
	g.t.Helper()
	for i := 0; i < n; i++ {
		line := g.waitFor(func(line string) bool { _, ok := ParseDemoRound(line); return ok })
		if r, _ := ParseDemoRound(line); !want(r) {
			g.t.Fatalf("guest %s: unexpected status line %q; serial so far:\n%s", g.name, line, g.out.String())
		}
	}
}

// typeLine writes line and CR LF to the guest's UART.
func (g *qemuGuest) typeLine(line string) {
	g.t.Helper()
	if _, err := io.WriteString(g.stdin, line+"\r\n"); err != nil {
		g.t.Fatal(err)
	}
}

// demoRounds parses every status line of demo's output, checking that the
// rounds count up from 1 without a gap.
func demoRounds(t *testing.T, out string) []DemoRound {
	t.Helper()
	var rounds []DemoRound
	for _, line := range strings.Split(out, "\n") {
		if r, ok := ParseDemoRound(line); ok {
			if r.Round != uint64(len(rounds))+1 {
				t.Errorf("status line %q after %d rounds", line, len(rounds))
			}
			rounds = append(rounds, r)
		}
	}
	return rounds
}

func TestQEMUDemoVerifiesRoundsEchoesAndQuits(t *testing.T) {
	forEachAccel(t, func(t *testing.T, accel []string) {
		testDemo(t, accel, 0, DefaultDemoSectorsPerRound)
	})
}

func TestQEMUDemoCapsSectorsPerRound(t *testing.T) {
	testDemo(t, tcg, 100, MaxDemoSectorsPerRound)
}

// testDemo runs demo on a 1 MiB image with Params.Sectors set to sectors:
// it waits for two rounds that each wrote and verified perRound sectors,
// types a line and waits for its echo, then quits, and checks the image
// holds what the rounds wrote.
func testDemo(t *testing.T, accel []string, sectors, perRound uint64) {
	const seed, capacity = 0x5eed, 2048
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, capacity*512), 0o644); err != nil {
		t.Fatal(err)
	}
	p := Params{Seed: seed, Sectors: sectors, TSCkHz: demoTSCkHz}
	g := startQEMU(t, accel, "demo", &p, demoDiskArgs(img, "terndemo0")...)
	ready := g.waitFor(func(line string) bool { return strings.HasPrefix(line, DemoReadyPrefix) })
	if r, ok := ParseDemoReady(ready); !ok || r != (DemoReady{Disk: true, Sectors: capacity}) {
		t.Fatalf("ready line %q, want a disk of %d sectors", ready, capacity)
	}
	if !strings.Contains(g.out.String(), "demo: disk id terndemo0\n") {
		t.Errorf("serial output %q lacks the disk id", g.out.String())
	}
	okRound := func(r DemoRound) bool { return r.OK && r.Wrote == perRound && r.Verified == perRound }
	g.waitDemoRounds(2, okRound)
	g.typeLine("hello demo")
	g.waitFor(func(line string) bool { return line == DemoEchoPrefix+"hello demo" })
	g.waitDemoRounds(1, okRound)
	g.typeLine(DemoQuit)
	out, code := g.wait()
	if !strings.HasSuffix(out, DemoEchoPrefix+DemoQuit+"\n"+DemoBye+"\n") {
		t.Errorf("serial output %q does not end with the echoed quit and the bye", out)
	}
	if code != qemuExitSuccess {
		t.Errorf("qemu exit status %d, want %d", code, qemuExitSuccess)
	}
	rounds := demoRounds(t, out)
	for _, r := range rounds {
		if !okRound(r) {
			t.Errorf("round %+v, want %d sectors written and verified", r, perRound)
		}
	}

	// Replay the rounds: later rounds overwrite earlier ones after a wrap.
	want := make([]byte, capacity*512)
	for _, r := range rounds {
		first := DemoRoundFirstSector(r.Round, perRound, capacity)
		for s := first; s < first+perRound; s++ {
			copy(want[s*512:], DemoPattern(seed, s, r.Round))
		}
	}
	got, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the image does not hold the patterns of the %d rounds the guest reported", len(rounds))
	}
}

func TestQEMUDemoWithoutDiskKeepsRunningAndEchoes(t *testing.T) {
	forEachAccel(t, func(t *testing.T, accel []string) {
		g := startQEMU(t, accel, "demo", &Params{TSCkHz: demoTSCkHz})
		if line, _ := g.next(); line != DemoNoDisk {
			t.Fatalf("first line %q, want %q", line, DemoNoDisk)
		}
		ready := g.waitFor(func(line string) bool { return strings.HasPrefix(line, DemoReadyPrefix) })
		if r, ok := ParseDemoReady(ready); !ok || r.Disk {
			t.Fatalf("ready line %q, want no disk", ready)
		}
		noDisk := func(r DemoRound) bool { return r.NoDisk }
		g.waitDemoRounds(2, noDisk)
		g.typeLine("still here")
		g.waitFor(func(line string) bool { return line == DemoEchoPrefix+"still here" })
		g.waitDemoRounds(1, noDisk)
		g.typeLine(DemoQuit)
		out, code := g.wait()
		if !strings.HasSuffix(out, DemoEchoPrefix+DemoQuit+"\n"+DemoBye+"\n") || code != qemuExitSuccess {
			t.Errorf("serial output %q status %d, want the echoed quit, the bye and status %d", out, code, qemuExitSuccess)
		}
		if n := strings.Count(out, DemoNoDisk+"\n"); n != 1 {
			t.Errorf("%q said %d times, want once", DemoNoDisk, n)
		}
		demoRounds(t, out)
	})
}

func TestQEMUKVMDirtyForeverReportsAGapWhileStopped(t *testing.T) {
	kvmUsable(t)
	// A TSC frequency far below the real one makes the 1 ms threshold a
	// few microseconds of real time: the time QEMU spends stopped by
	// SIGSTOP is a gap the guest must report as it resumes.
	p := Params{MemBytes: 2 << 20, WorkingSetBytes: 1 << 20, Passes: PassesForever, TSCkHz: 10_000, VerifyEverySec: 1000}
	g := startQEMU(t, kvm, "dirty", &p)
	g.waitFor(func(line string) bool { return strings.HasPrefix(line, "dirty: filled ") })
	pid := g.cmd.Process.Pid
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitProcState(t, pid, 'T')
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	line := g.waitFor(func(line string) bool { _, ok := ParseDirtyGap(line); return ok })
	if gap, _ := ParseDirtyGap(line); gap <= DirtyGapReportAbove {
		t.Errorf("%q: a reported gap must exceed %v", line, DirtyGapReportAbove)
	}
}

// waitProcState waits until process pid's state (the field after its
// name in /proc/PID/stat) is state.
func waitProcState(t *testing.T, pid int, state byte) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d never reached state %c: %s", pid, state, b)
		}
		runtime.Gosched()
	}
}

// TestQEMUSMPStartsItsAPsAndEveryCPUKeepsCounting runs the smp guest on
// four CPUs under QEMU's own local APIC (TCG) and KVM's: it starts its APs
// from their wait-for-SIPI state, and every CPU keeps working, verifying
// its memory and taking its timer and the others' IPIs. Under TCG the
// local APIC has no TSC-deadline mode, so every timer is periodic there.
func TestQEMUSMPStartsItsAPsAndEveryCPUKeepsCounting(t *testing.T) {
	forEachAccel(t, func(t *testing.T, accel []string) {
		const cpus = 4
		g := startQEMU(t, accel, "smp", &Params{VCPUs: cpus}, "-smp", fmt.Sprint(cpus))
		g.waitFor(func(l string) bool { return l == SMPAllStarted(cpus) })
		modes, _ := ParseSMPTimers(g.waitFor(func(l string) bool { _, ok := ParseSMPTimers(l); return ok }))
		t.Logf("timers: %q", modes)
		pass := func(done func(SMPPass) bool) SMPPass {
			var p SMPPass
			g.waitFor(func(l string) bool {
				if strings.HasPrefix(l, SMPFailPrefix) || strings.HasPrefix(l, ExceptionPrefix) {
					t.Fatalf("smp guest: %s\nserial:\n%s", l, g.out.String())
				}
				var ok bool
				p, ok = ParseSMPPass(l)
				return ok && done(p)
			})
			return p
		}
		first := pass(func(p SMPPass) bool { return p.APs == "started" })
		last := pass(func(p SMPPass) bool { return p.N >= first.N+4 })
		if err := CheckSMPProgress(first, last); err != nil {
			t.Fatal(err)
		}
		t.Logf("pass %d: %+v", last.N, last.CPUs)
	})
}
