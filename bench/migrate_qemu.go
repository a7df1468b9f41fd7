package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"tern/vmm/guests"
)

// qemuResult is one QEMU live migration: query-migrate's total-time and
// downtime, and the guest's own longest gap.
type qemuResult struct {
	totalMs, downtimeMs, guestGapMs float64
}

// Bounds of the QEMU peer's waits.
const (
	qmpWait        = 30 * time.Second
	qemuPollPeriod = 10 * time.Millisecond // query-migrate while it runs
)

// qemuProc is one qemu-system-x86_64 running the dirty guest: its serial
// lines and its QMP connection.
type qemuProc struct {
	cmd   *exec.Cmd
	lines chan string // serial output; closed when QEMU's stdout is
	qmp   *qmpClient
}

// startQEMUProc starts QEMU on elf with the parameter block params and
// extra arguments; QEMU connects its QMP to a socket this listens on.
func startQEMUProc(ctx context.Context, qemu, dir, name, elf, params string, sizeMiB uint64, extra ...string) (*qemuProc, error) {
	sock := filepath.Join(dir, name+".qmp")
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("starting QEMU %s: %w", name, err)
	}
	defer ln.Close()
	args := append(append(guests.QEMUMachineArgs(), "-enable-kvm", "-m", fmt.Sprintf("%dM", sizeMiB),
		"-nodefaults", "-no-reboot", "-nographic", "-display", "none", "-serial", "stdio",
		"-qmp", "unix:"+sock, "-kernel", elf,
		"-device", fmt.Sprintf("loader,file=%s,addr=%#x,force-raw=on", params, guests.ParamsAddr)), extra...)
	cmd := exec.CommandContext(ctx, qemu, args...)
	logFile, err := os.Create(filepath.Join(dir, name+".qemu.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting QEMU %s: %w", name, err)
	}
	p := &qemuProc{cmd: cmd, lines: make(chan string, 1<<16)}
	go func() { // ends when QEMU's stdout closes, which stop ensures
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- strings.TrimRight(sc.Text(), "\r")
		}
	}()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	select {
	case c, ok := <-accepted:
		if !ok {
			p.stop()
			return nil, fmt.Errorf("starting QEMU %s: accepting its QMP connection failed", name)
		}
		if p.qmp, err = newQMPClient(c, qmpWait); err != nil {
			c.Close()
			p.stop()
			return nil, fmt.Errorf("QEMU %s: %w", name, err)
		}
	case <-time.After(qmpWait):
		p.stop()
		return nil, fmt.Errorf("starting QEMU %s: no QMP connection within %v; see %s.qemu.log", name, qmpWait, name)
	}
	return p, nil
}

// waitLine returns the first serial line match accepts, within wait.
func (p *qemuProc) waitLine(wait time.Duration, what string, match func(string) bool) (string, error) {
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				return "", fmt.Errorf("waiting for %s: QEMU's output ended", what)
			}
			if match(line) {
				return line, nil
			}
		case <-timer.C:
			return "", fmt.Errorf("waiting for %s: none within %v", what, wait)
		}
	}
}

func (p *qemuProc) stop() {
	if p.qmp != nil {
		p.qmp.close()
	}
	p.cmd.Process.Kill()
	for range p.lines {
	}
	p.cmd.Wait()
}

// runQEMUMigration boots the same dirty guest under QEMU (the TSC
// frequency tern reported, so the same rate; idle at rate 0), migrates
// it with QMP migrate at QEMU's default settings (or, when
// maxBytesPerSec is not 0, with max-bandwidth set to it) to a second QEMU
// started with -incoming on loopback, and reads query-migrate's times
// and the guest's gaps (the source's after migrate, the target's up to
// its first verification, which must pass).
func runQEMUMigration(ctx context.Context, qemu, dir string, size, rate, khz, maxBytesPerSec uint64) (qemuResult, error) {
	elfBytes, err := guests.ELF("dirty")
	if err != nil {
		return qemuResult{}, err
	}
	elf := filepath.Join(dir, "dirty.elf")
	if err := os.WriteFile(elf, elfBytes, 0o644); err != nil {
		return qemuResult{}, err
	}
	if khz == 0 {
		khz = guests.DefaultTSCkHz
	}
	p := guests.Params{MemStart: 4 << 20, MemBytes: (size - benchDirtyMemSkip) << 20, WorkingSetBytes: benchWorkingSet << 20,
		Passes: guests.PassesForever, TSCkHz: khz, VerifyEverySec: 1, Idle: rate == 0}
	if rate > 0 {
		p.PageDelayTSC = khz * 1000 / (rate << 8)
	}
	params := filepath.Join(dir, "params.bin")
	if err := os.WriteFile(params, p.Encode(), 0o644); err != nil {
		return qemuResult{}, err
	}
	port, err := freeTCPPort()
	if err != nil {
		return qemuResult{}, err
	}
	src, err := startQEMUProc(ctx, qemu, dir, "qemu-source", elf, params, size)
	if err != nil {
		return qemuResult{}, err
	}
	defer src.stop()
	dst, err := startQEMUProc(ctx, qemu, dir, "qemu-target", elf, params, size, "-incoming", fmt.Sprintf("tcp:127.0.0.1:%d", port))
	if err != nil {
		return qemuResult{}, err
	}
	defer dst.stop()
	if _, err := src.waitLine(guestSteadyWait, "the QEMU guest's first rate line", func(l string) bool {
		_, ok := guests.ParseDirtyRate(l)
		return ok
	}); err != nil {
		return qemuResult{}, err
	}
	if maxBytesPerSec > 0 {
		if err := src.qmp.execute("migrate-set-parameters", map[string]any{"max-bandwidth": maxBytesPerSec}, nil); err != nil {
			return qemuResult{}, fmt.Errorf("setting QEMU's max-bandwidth: %w", err)
		}
	}
	if err := src.qmp.execute("migrate", map[string]any{"uri": fmt.Sprintf("tcp:127.0.0.1:%d", port)}, nil); err != nil {
		return qemuResult{}, err
	}
	var st qemuMigrationStatus
	deadline := time.Now().Add(migrateWait)
	for {
		if err := src.qmp.execute("query-migrate", nil, &st); err != nil {
			return qemuResult{}, err
		}
		if st.Status == "completed" {
			break
		}
		if st.Status == "failed" || st.Status == "cancelled" {
			return qemuResult{}, fmt.Errorf("QEMU's migration %s: %s", st.Status, st.ErrorDesc)
		}
		if time.Now().After(deadline) {
			src.qmp.execute("migrate_cancel", nil, nil)
			return qemuResult{}, fmt.Errorf("QEMU's migration did not complete within %v (status %s)", migrateWait, st.Status)
		}
		time.Sleep(qemuPollPeriod)
	}
	if st.TotalTime == nil || st.Downtime == nil {
		return qemuResult{}, fmt.Errorf("QEMU's completed migration reports no total-time or downtime")
	}
	var gap time.Duration
	for drained := false; !drained; {
		select {
		case l := <-src.lines:
			if g, ok := dirtyGap(l); ok {
				gap = max(gap, g)
			}
		default:
			drained = true
		}
	}
	var verify guests.DirtyVerify
	if _, err := dst.waitLine(afterMigrateWait, "the QEMU guest's first verification after the migration", func(l string) bool {
		if g, ok := dirtyGap(l); ok {
			gap = max(gap, g)
		}
		v, ok := guests.ParseDirtyVerify(l)
		verify = v
		return ok
	}); err != nil {
		return qemuResult{}, err
	}
	if !verify.Pass {
		return qemuResult{}, fmt.Errorf("the QEMU guest's memory is wrong after the migration: verify FAIL %s", verify.Detail)
	}
	return qemuResult{totalMs: float64(*st.TotalTime), downtimeMs: float64(*st.Downtime), guestGapMs: ms(gap)}, nil
}

// freeTCPPort returns a loopback port that was free a moment ago.
func freeTCPPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
