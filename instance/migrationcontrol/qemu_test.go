package migrationcontrol

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"tern/internal/kvmhost"
	"tern/vmm/guests"
	"tern/vmm/linuxguest"
	"tern/vmm/linuxtest"
)

const qemuBinary = "qemu-system-x86_64"

// QEMUBandwidthEnv, when set, is QEMU's migration bandwidth limit in
// bytes per second (its max-bandwidth parameter). In the emulated host
// tern's QUIC migration of this guest moves about 2 MB/s and keeps dirty
// logging on for a minute or more, QEMU's unlimited one about 10 s: the
// limit gives QEMU's guest as long a time under dirty logging.
const QEMUBandwidthEnv = "TERN_CONTROL_QEMU_BANDWIDTH"

// qemuData are QEMU's firmware and option ROMs (qboot.rom, the
// linuxboot ROM -kernel loads), carried into the emulated host.
var qemuData = []string{"/usr/share/qemu", "/usr/share/seabios"}

// prepareQEMU is a kvmtest.WithPrepare function: QEMU (its shared
// libraries follow it, kvmhost.Options.Files) and its data.
func prepareQEMU() ([]kvmhost.File, func(), error) {
	p, err := exec.LookPath(qemuBinary)
	if err != nil {
		return nil, nil, fmt.Errorf("the control experiment needs %s (apt-get install qemu-system-x86): %w", qemuBinary, err)
	}
	files := []kvmhost.File{{Host: p}}
	for _, d := range qemuData {
		if _, err := os.Stat(d); err == nil {
			files = append(files, kvmhost.File{Host: d})
		}
	}
	return files, nil, nil
}

// qemuVM is one qemu-system-x86_64 process: its serial console on
// stdin and stdout, QMP on a socket pair.
type qemuVM struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	console *readerLines
	qmp     *qmp
	stderr  *lockedBuffer
	// exited is closed once the process was waited for; exitErr is then
	// its status.
	exited  chan struct{}
	exitErr error
}

// startQEMU starts QEMU on the guest, and returns once its QMP answers
// (then an -incoming URI listens). incoming empty boots the guest.
func startQEMU(ctx context.Context, u linuxtest.UserlandFiles, disk, incoming string) (*qemuVM, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("making QMP's socket pair: %w", err)
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "qmp"), os.NewFile(uintptr(fds[1]), "qmp-qemu")
	defer theirs.Close()
	conn, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("making QMP's socket pair: %w", err)
	}
	args := append([]string{"-accel", "kvm", "-cpu", "host", "-smp", fmt.Sprint(guestVCPUs), "-m", fmt.Sprint(guestMemoryMiB)},
		guests.QEMUMachineArgs()...)
	args = append(args,
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-kernel", u.Kernel, "-initrd", u.Initrd, "-append", linuxguest.Cmdline,
		"-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con",
		"-drive", "file="+disk+",format=raw,if=none,id=vda",
		"-device", "virtio-blk-device,drive=vda",
		"-chardev", "socket,id=qmp,fd=3", "-mon", "chardev=qmp,mode=control")
	if incoming != "" {
		args = append(args, "-incoming", incoming)
	}
	cmd := exec.Command(qemuBinary, args...)
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	vm := &qemuVM{cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = vm.stderr
	if vm.stdin, err = cmd.StdinPipe(); err != nil {
		conn.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		conn.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("starting %s: %w", qemuBinary, err)
	}
	vm.console = newReaderLines(stdout)
	go func() {
		<-vm.console.done // Wait closes stdout: read it all first
		vm.exitErr = cmd.Wait()
		close(vm.exited)
	}()
	qctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if vm.qmp, err = newQMP(qctx, conn); err != nil {
		vm.kill()
		return nil, fmt.Errorf("%s: %w; stderr:\n%s", qemuBinary, err, vm.stderr)
	}
	if _, err := vm.qmp.exec(qctx, "migrate-set-capabilities", map[string]any{
		"capabilities": []map[string]any{{"capability": "events", "state": true}}}); err != nil {
		vm.kill()
		return nil, err
	}
	if bw := os.Getenv(QEMUBandwidthEnv); bw != "" {
		n, err := strconv.ParseUint(bw, 10, 64)
		if err != nil {
			vm.kill()
			return nil, fmt.Errorf("parsing %s=%q: want bytes per second", QEMUBandwidthEnv, bw)
		}
		// tern stops pre-copy after ten rounds, whatever the downtime
		// (migration.DefaultMaxRounds): at this rate QEMU's 300 ms default
		// never converges with the disk loop dirtying its pages, so it
		// may pause for as long as a round's worth of them takes.
		if _, err := vm.qmp.exec(qctx, "migrate-set-parameters", map[string]any{"max-bandwidth": n, "downtime-limit": 5000}); err != nil {
			vm.kill()
			return nil, err
		}
	}
	return vm, nil
}

// shell returns a Shell on vm's console.
func (vm *qemuVM) shell() *linuxtest.Shell { return linuxtest.NewShell(vm.stdin, vm.console) }

// untilExited returns a context cancelled when vm's process ends, so
// that a wait on the console of a guest that shut down ends at once.
func (vm *qemuVM) untilExited(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		select {
		case <-vm.exited:
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// kill ends the process and waits for it.
func (vm *qemuVM) kill() {
	vm.cmd.Process.Kill()
	<-vm.exited
}

// death says how vm ended, or that it still runs: its exit status, its
// shutdown and other events, its stderr.
func (vm *qemuVM) death() (signature, detail string) {
	select {
	case <-vm.exited:
		signature = fmt.Sprintf("QEMU exited (%v)", vm.exitErr)
	case <-time.After(5 * time.Second):
		signature = "QEMU still runs"
	}
	if vm.qmp != nil {
		if m, ok := vm.qmp.find("SHUTDOWN"); ok {
			signature += fmt.Sprintf(", SHUTDOWN %s", m.Data)
		}
		detail = "QMP events:\n" + vm.qmp.eventLog()
	}
	return signature, detail + "stderr:\n" + vm.stderr.String()
}

// freeLoopbackPort returns a TCP port of 127.0.0.1 free a moment ago.
func freeLoopbackPort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// migrationResult is how one migration ended.
type migrationResult struct {
	completed bool
	// guestDied is set with problem when the guest is gone (on either
	// side); unset with !completed the guest still runs on the source.
	guestDied bool
	problem   *guestProblem
	took      time.Duration
}

// migrateQEMU migrates src's guest to a new QEMU process, returned when
// the migration completed (src is then quit).
func migrateQEMU(ctx context.Context, t *testing.T, src *qemuVM, u linuxtest.UserlandFiles, disk, dir string, h hop, attempt int) (*qemuVM, migrationResult) {
	t.Helper()
	start := time.Now()
	var uri string
	if h == network {
		port, err := freeLoopbackPort()
		if err != nil {
			t.Fatal(err)
		}
		uri = fmt.Sprintf("tcp:127.0.0.1:%d", port)
	} else {
		uri = "unix:" + filepath.Join(dir, fmt.Sprintf("migration-%d.sock", attempt))
	}
	dst, err := startQEMU(ctx, u, disk, uri)
	if err != nil {
		t.Fatalf("starting the migration target: %v", err)
	}
	from := src.qmp.count() // events so far
	if _, err := src.qmp.exec(ctx, "migrate", map[string]any{"uri": uri}); err != nil {
		dst.kill()
		return nil, migrationResult{guestDied: true, problem: &guestProblem{what: "source gone", signature: err.Error()}}
	}
	t.Logf("control: qemu: migration %d to %s starts", attempt, uri)
	mctx, cancel := context.WithTimeout(ctx, migrationLimit)
	defer cancel()
	var status string
	ev, _, err := src.qmp.waitEvent(mctx, from, func(m qmpMessage) bool {
		if m.Event == "SHUTDOWN" {
			return true
		}
		var d struct{ Status string }
		json.Unmarshal(m.Data, &d)
		status = d.Status
		return m.Event == "MIGRATION" && (d.Status == "completed" || d.Status == "failed" || d.Status == "cancelled")
	})
	res := migrationResult{took: time.Since(start)}
	switch {
	case err != nil || ev.Event == "SHUTDOWN":
		dst.kill()
		sig := fmt.Sprintf("SHUTDOWN %s", ev.Data)
		if err != nil {
			sig = fmt.Sprintf("waiting for the migration's end: %v", err)
		}
		res.guestDied, res.problem = true, &guestProblem{what: "source QEMU shut down during the migration", signature: sig}
		return nil, res
	case status != "completed":
		info, _ := src.qmp.exec(ctx, "query-migrate", nil)
		dst.kill()
		res.problem = &guestProblem{what: "migration failed", signature: string(info)}
		return nil, res
	}
	res.completed = true
	// The target runs the guest once it has loaded it: its RESUME.
	if _, _, err := dst.qmp.waitEvent(mctx, 0, func(m qmpMessage) bool { return m.Event == "RESUME" || m.Event == "SHUTDOWN" }); err != nil {
		t.Logf("control: qemu: the target's RESUME did not come: %v", err)
	}
	src.qmp.exec(ctx, "quit", nil)
	select {
	case <-src.exited:
	case <-time.After(time.Minute):
		src.kill()
	}
	return dst, res
}

// TestControlQEMU is the control: the guest under QEMU.
func TestControlQEMU(t *testing.T) {
	n := migrations(t)
	u := linuxtest.Userland(t)
	c := newTally("qemu")
	defer c.report(t)
	dir := t.TempDir()
	ctx := t.Context()
	var (
		vm   *qemuVM
		sh   *linuxtest.Shell
		disk string
		pass int
		// bootFailures counts boots in a row that failed.
		bootFailures int
	)
	lose := func(attempt int, h string, p *guestProblem) {
		t.Helper()
		if vm != nil {
			sig, detail := vm.death()
			p.detail += "\n" + sig + "\n" + detail
			vm.kill()
		}
		if sh != nil {
			p.detail += "\nconsole's last lines:\n" + sh.Seen()
		}
		c.fail(t, failure{attempt: attempt, hop: h, what: p.what, signature: p.signature, detail: p.detail})
		vm, sh = nil, nil
	}
	for c.attempted < n {
		if vm == nil {
			if bootFailures == 3 {
				t.Fatalf("three boots in a row failed: the experiment cannot go on")
			}
			c.boots++
			disk = filepath.Join(dir, fmt.Sprintf("vda-%d.img", c.boots))
			if err := os.WriteFile(disk, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(disk, diskMiB<<20); err != nil {
				t.Fatal(err)
			}
			var err error
			if vm, err = startQEMU(ctx, u, disk, ""); err != nil {
				t.Fatal(err)
			}
			sh = vm.shell()
			boot := time.Now()
			var p *guestProblem
			gctx, stop := vm.untilExited(ctx)
			pass, p = bootAndStart(gctx, sh)
			stop()
			if p != nil {
				bootFailures++
				lose(0, "boot", p)
				continue
			}
			bootFailures = 0
			t.Logf("control: qemu: guest %d ready and working in %.0f s", c.boots, time.Since(boot).Seconds())
		}
		attempt, h := c.attempted+1, hopOf(c.attempted)
		name := c.hopName(h)
		c.attempted++
		c.attemptedBy[name]++
		dst, res := migrateQEMU(ctx, t, vm, u, disk, dir, h, attempt)
		if !res.completed {
			if res.guestDied {
				lose(attempt, name, res.problem)
				continue
			}
			c.notCompletedAlive++
			t.Logf("control: qemu: migration %d (%s) failed, the guest still on the source: %s", attempt, name, res.problem.signature)
			continue
		}
		c.completed++
		c.completedBy[name]++
		vm, sh = dst, dst.shell()
		sh.Limit = shellLimit
		gctx, stop := vm.untilExited(ctx)
		now, p := checkGuest(gctx, sh, pass)
		stop()
		if p != nil {
			lose(attempt, name, p)
			continue
		}
		t.Logf("control: qemu: migration %d (%s) completed in %.1f s; the guest made disk passes %d to %d", attempt, name, res.took.Seconds(), pass, now)
		pass = now
	}
	if vm != nil {
		vm.qmp.exec(ctx, "quit", nil)
		select {
		case <-vm.exited:
		case <-time.After(time.Minute):
			vm.kill()
		}
	}
}

// lockedBuffer is a bytes.Buffer safe for a writer and readers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
