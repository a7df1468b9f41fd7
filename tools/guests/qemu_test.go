package guests

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// These tests run the committed guests under QEMU's TCG emulator (no KVM
// needed), through the PVH entry: they prove the guests themselves (entry
// stub, UART, exit port, virtio-blk driver, dirty pattern), not tern.

// qemuRun boots guest under `qemu-system-x86_64 -M microvm -accel tcg` with
// an isa-debug-exit device at 0xf4 and returns the serial output and
// QEMU's exit status.
func qemuRun(t *testing.T, guest string, extra ...string) (string, int) {
	t.Helper()
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86): cannot run guests under TCG")
	}
	b, err := ELF(guest)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), guest+".elf")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// Generous for TCG on a loaded machine: only a hung guest waits it out.
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	args := append([]string{"-M", "microvm", "-accel", "tcg", "-m", "128M",
		"-nodefaults", "-no-reboot", "-nographic", "-display", "none", "-serial", "stdio",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04", "-kernel", path}, extra...)
	cmd := exec.CommandContext(ctx, qemu, args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("guest %s did not exit within the deadline; serial so far:\n%s", guest, stdout.String())
	}
	var ee *exec.ExitError
	code := 0
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running qemu: %v\n%s", err, stderr.String())
	}
	if stderr.Len() > 0 {
		t.Logf("qemu stderr: %s", stderr.String())
	}
	return strings.ReplaceAll(stdout.String(), "\r\n", "\n"), code
}

// qemuExitSuccess is QEMU's exit status when the guest wrote 0 to the
// isa-debug-exit port: (0<<1)|1.
const qemuExitSuccess = 1

func TestQEMUHelloPrintsAndExitsZero(t *testing.T) {
	out, code := qemuRun(t, "hello")
	if out != "Hello from the tern test guest\n" {
		t.Errorf("serial output %q, want exactly the hello line", out)
	}
	if code != qemuExitSuccess {
		t.Errorf("qemu exit status %d, want %d (guest status 0)", code, qemuExitSuccess)
	}
}

func TestQEMUDiskWritesVerifiesAndLeavesThePatternOnTheImage(t *testing.T) {
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(img, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := qemuRun(t, "disk",
		"-global", "virtio-mmio.force-legacy=false",
		"-drive", "id=d0,file="+img+",format=raw,if=none",
		"-device", "virtio-blk-device,drive=d0,serial=terndisk0")
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
	out, code := qemuRun(t, "disk")
	if !strings.Contains(out, "disk: FAIL no virtio-blk device") || code != (2<<1)|1 {
		t.Errorf("output %q status %d, want the no-device failure and guest status 2", out, code)
	}
}

func TestQEMUDirtyHonoursParamsAndVerifies(t *testing.T) {
	params := filepath.Join(t.TempDir(), "params.bin")
	p := Params{MemStart: 8 << 20, MemBytes: 4 << 20, WorkingSetBytes: 256 << 10, Passes: 3}
	if err := os.WriteFile(params, p.Encode(), 0o644); err != nil {
		t.Fatal(err)
	}
	out, code := qemuRun(t, "dirty", "-device",
		fmt.Sprintf("loader,file=%s,addr=%#x,force-raw=on", params, ParamsAddr))
	for _, want := range []string{
		"dirty: 1024 pages at 0x800000, working set 64 pages\n",
		"dirty: verify PASS generation 3\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("serial output %q lacks %q", out, want)
		}
	}
	if !regexp.MustCompile(`dirty: max progress gap [0-9]+ tsc ticks\n`).MatchString(out) {
		t.Errorf("serial output %q lacks the progress-gap line", out)
	}
	if code != qemuExitSuccess {
		t.Errorf("qemu exit status %d, want %d", code, qemuExitSuccess)
	}
}
