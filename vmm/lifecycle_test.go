package vmm_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"tern/internal/blockio"
	"tern/vmm"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxtest"
	"tern/vmm/memory"
	"tern/vmm/vcpu"
)

// tinyELF is an x86-64 ELF executable whose one segment, code, is loaded
// and entered at 1 MiB.
func tinyELF(code []byte) []byte {
	const base, hdr = 0x100000, 64 + 56
	b := make([]byte, hdr+len(code))
	le := binary.LittleEndian
	copy(b, "\x7fELF\x02\x01\x01")
	le.PutUint16(b[16:], 2)  // ET_EXEC
	le.PutUint16(b[18:], 62) // EM_X86_64
	le.PutUint32(b[20:], 1)
	le.PutUint64(b[24:], base) // entry
	le.PutUint64(b[32:], 64)   // phoff
	le.PutUint16(b[52:], 64)
	le.PutUint16(b[54:], 56)
	le.PutUint16(b[56:], 1)
	ph := b[64:]
	le.PutUint32(ph[0:], 1)   // PT_LOAD
	le.PutUint32(ph[4:], 5)   // R+X
	le.PutUint64(ph[8:], hdr) // offset
	le.PutUint64(ph[16:], base)
	le.PutUint64(ph[24:], base)
	le.PutUint64(ph[32:], uint64(len(code)))
	le.PutUint64(ph[40:], uint64(len(code)))
	copy(b[hdr:], code)
	return b
}

// writeGuest writes an ELF guest into the test's directory.
func writeGuest(t *testing.T, name string, elf []byte) string {
	path := filepath.Join(t.TempDir(), name+".elf")
	if err := os.WriteFile(path, elf, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// Guests that misbehave at CPL0 on tern's boot state (no IDT).
var (
	// tripleFaultCode is ud2: with no IDT the #UD becomes #GP, then #DF,
	// then a triple fault.
	tripleFaultCode = []byte{0x0f, 0x0b}
	// spinCode prints the line "x" on the UART, then spins (jmp $) and never
	// exits on its own.
	spinCode = []byte{0x66, 0xba, 0xf8, 0x03, 0xb0, 'x', 0xee, 0xb0, '\n', 0xee, 0xeb, 0xfe}
)

func TestTripleFaultEndsRunWithErrShutdown(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: writeGuest(t, "triple", tinyELF(tripleFaultCode))})
	r := wait(t, start(t, vm))
	if !errors.Is(r.err, vcpu.ErrShutdown) {
		t.Fatalf("Run = %d, %v; want ErrShutdown", r.status, r.err)
	}
	if !strings.Contains(r.err.Error(), "triple-faulted") {
		t.Errorf("error %q does not say the guest triple-faulted", r.err)
	}
}

func TestStopEndsASpinningGuest(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: writeGuest(t, "spin", tinyELF(spinCode)), VCPUs: 2})
	con := newConsole(t, vm)
	done := start(t, vm)
	con.waitFor("the spinning guest's x", func(string) bool { return true })
	if err := vm.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if err := vm.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	vm.Stop()
	if r := wait(t, done); !errors.Is(r.err, vmm.ErrStopped) {
		t.Fatalf("Run = %d, %v; want ErrStopped", r.status, r.err)
	}
}

func TestContextDeadlineEndsASpinningGuest(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: writeGuest(t, "spin", tinyELF(spinCode))})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan runResult, 1)
	go func() {
		s, err := vm.Run(ctx)
		done <- runResult{s, err}
	}()
	if r := wait(t, done); !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("Run = %d, %v; want DeadlineExceeded", r.status, r.err)
	}
}

func TestPauseAndResumeARunningDirtyGuest(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: "dirty", Params: &guests.Params{Passes: guests.PassesForever}})
	con := newConsole(t, vm)
	done := start(t, vm)
	verify := func(request uint32) guests.DirtyVerify {
		t.Helper()
		if err := vm.Memory().AtomicPutUint32(guests.ParamsAddr+guests.VerifyRequestOffset, request); err != nil {
			t.Fatal(err)
		}
		line := con.waitFor("a verify line", func(l string) bool { _, ok := guests.ParseDirtyVerify(l); return ok })
		v, _ := guests.ParseDirtyVerify(line)
		if !v.Pass {
			t.Fatalf("the dirty guest failed its verification: %s", line)
		}
		return v
	}
	before := verify(1)

	if err := vm.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	_, end := vm.Serial().Output().Bounds()
	for _, c := range vm.VCPUs() {
		regs, err := c.KVM().Regs()
		if err != nil {
			t.Fatalf("reading the paused vCPU %d's registers: %v", c.ID(), err)
		}
		if regs.RIP == 0 {
			t.Errorf("paused vCPU %d has RIP 0", c.ID())
		}
	}
	if _, now := vm.Serial().Output().Bounds(); now != end {
		t.Errorf("the guest printed while paused (%d bytes)", now-end)
	}
	if err := vm.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	after := verify(2)
	if after.Generation < before.Generation {
		t.Errorf("generation went back from %d to %d across the pause", before.Generation, after.Generation)
	}
	vm.Stop()
	if r := wait(t, done); !errors.Is(r.err, vmm.ErrStopped) {
		t.Fatalf("Run = %d, %v; want ErrStopped", r.status, r.err)
	}
	if err := vm.Pause(); !errors.Is(err, vcpu.ErrNotRunning) {
		t.Errorf("Pause after Run = %v, want ErrNotRunning", err)
	}
}

// resources counts what a VM holds: open fds, goroutines, and mappings of
// guest RAM or kvm_run.
type resources struct{ fds, goroutines, mappings int }

func count(t *testing.T) resources {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, "memfd:tern-ram") || strings.Contains(l, "kvm-vcpu") {
			n++
		}
	}
	return resources{fds: len(fds), goroutines: runtime.NumGoroutine(), mappings: n}
}

func TestCloseLeavesNoFdGoroutineOrMapping(t *testing.T) {
	kvmtest.Require(t)
	before := count(t)
	vm, err := vmm.New(vmm.Config{Guest: "echo", MemoryBytes: 64 << 20, VCPUs: 2})
	if err != nil {
		t.Fatal(err)
	}
	con := newConsole(t, vm)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan runResult, 1)
	go func() {
		s, err := vm.Run(ctx)
		done <- runResult{s, err}
	}()
	con.waitLine(guests.EchoReady)
	during := count(t)
	if during.mappings == 0 || during.fds <= before.fds {
		t.Errorf("a running VM holds %+v, no more than before %+v: the count sees nothing", during, before)
	}
	if err := vm.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	cancel()
	wait(t, done)
	con.sub.Close()
	// A goroutine that has signalled its end still needs a moment to
	// return; retry the count (as goleak does) rather than sleep once.
	deadline := time.Now().Add(10 * time.Second)
	leaked := func(r resources) bool {
		return r.fds != before.fds || r.mappings != before.mappings || r.goroutines > before.goroutines
	}
	after := count(t)
	for leaked(after) && time.Now().Before(deadline) {
		runtime.Gosched()
		time.Sleep(time.Millisecond)
		after = count(t)
	}
	if leaked(after) {
		t.Fatalf("after Close: %+v, before New: %+v", after, before)
	}
}

func TestNewRejectsEachBadConfigWithOneError(t *testing.T) {
	kvmtest.Require(t)
	notELF := writeGuest(t, "text", []byte("this is not an ELF file\n"))
	hello := "hello"
	for _, c := range []struct {
		name string
		cfg  vmm.Config
		want string
	}{
		{"zero memory", vmm.Config{Guest: hello}, "memory: zero bytes"},
		{"missing guest file", vmm.Config{Guest: "/nonexistent/guest.elf", MemoryBytes: 64 << 20}, "reading guest file"},
		{"unknown guest", vmm.Config{Guest: "nosuch", MemoryBytes: 64 << 20}, `unknown guest "nosuch"`},
		{"non-ELF file", vmm.Config{Guest: notELF, MemoryBytes: 64 << 20}, "not an ELF file"},
		{"overlapping regions", vmm.Config{Guest: hello, Regions: []memory.RegionSpec{
			{Name: "low", Base: 0, Size: 64 << 20}, {Name: "high", Base: 32 << 20, Size: 64 << 20}}}, "overlaps"},
		{"RAM over the MMIO hole", vmm.Config{Guest: hello, MemoryBytes: 3<<30 + 1<<20}, "boot timer's MMIO window"},
		{"RAM below the boot area", vmm.Config{Guest: hello, Regions: []memory.RegionSpec{
			{Name: "high", Base: 1 << 20, Size: 64 << 20}}}, "boot area"},
		{"too many vCPUs", vmm.Config{Guest: hello, MemoryBytes: 64 << 20, VCPUs: 1 << 20}, "more than this host's KVM allows"},
		{"too many disks", vmm.Config{Guest: hello, MemoryBytes: 64 << 20, Disks: disks(vmm.MaxDisks + 1)}, "at most 8"},
		{"Disk and Disks", vmm.Config{Guest: hello, MemoryBytes: 64 << 20, Disk: disks(1)[0], Disks: disks(1)}, "not both"},
	} {
		t.Run(c.name, func(t *testing.T) {
			vm, err := vmm.New(c.cfg)
			if err == nil {
				vm.Close()
				t.Fatal("New accepted the config")
			}
			if !errors.Is(err, vmm.ErrInvalidConfig) {
				t.Errorf("error %q does not wrap ErrInvalidConfig", err)
			}
			joined, ok := err.(interface{ Unwrap() []error })
			if !ok || len(joined.Unwrap()) != 1 {
				t.Errorf("want exactly one error, got %q", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}
}

// disks returns n backends that serve nothing: the configs that use them
// are rejected before any IO.
func disks(n int) []blockio.Device {
	out := make([]blockio.Device, n)
	for i := range out {
		out[i] = unusedDisk{}
	}
	return out
}

// unusedDisk is a backend no test reaches.
type unusedDisk struct{ blockio.Device }

// TestLinuxVMWiresItsDisksAndCloseUnwiresThem builds (but does not boot)
// a Linux VM with two file disks: each gets an irqfd on its slot's GSI,
// and a driver's set-up of the first one's queue, done here through its
// registers as the guest would, assigns an ioeventfd in KVM and starts the
// queue's worker. Close leaves no fd, goroutine or mapping behind.
func TestLinuxVMWiresItsDisksAndCloseUnwiresThem(t *testing.T) {
	kvmtest.Require(t)
	g := linuxtest.Files(t)
	var backends []blockio.Device
	for i := range 2 {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("disk%d.img", i))
		if err := os.WriteFile(path, make([]byte, 1<<20), 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := devices.OpenFileBackend(path, 512)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		backends = append(backends, b)
	}
	before := count(t)
	vm, err := vmm.New(vmm.Config{Linux: &vmm.LinuxGuest{Kernel: g.BzImage, Initrd: g.Initrd}, MemoryBytes: 256 << 20, Disks: backends})
	if err != nil {
		t.Fatal(err)
	}
	built := count(t)
	blk := vm.VirtioBlks()[0]
	reg := func(off uint64, v uint32) { blk.WriteMMIO(off, binary.LittleEndian.AppendUint32(nil, v)) }
	// virtio 1.x set-up of queue 0, rings high in RAM (past the kernel).
	const rings = 200 << 20
	reg(0x070, devices.StatusAcknowledge|devices.StatusDriver)
	reg(0x024, 1)
	reg(0x020, 1) // VERSION_1
	reg(0x070, devices.StatusAcknowledge|devices.StatusDriver|devices.StatusFeaturesOK)
	reg(0x030, 0)
	reg(0x038, 16)
	reg(0x080, rings)
	reg(0x090, rings+0x1000)
	reg(0x0a0, rings+0x2000)
	reg(0x044, 1)
	reg(0x070, devices.StatusAcknowledge|devices.StatusDriver|devices.StatusFeaturesOK|devices.StatusDriverOK)
	if st := blk.Status(); st&devices.StatusDriverOK == 0 || st&devices.StatusNeedsReset != 0 {
		t.Fatalf("device status %#x after set-up", st)
	}
	running := count(t)
	// Two irqfds' eventfds and the queue's ioeventfd; its worker.
	if built.fds < before.fds+2 || running.fds != built.fds+1 || running.goroutines <= built.goroutines {
		t.Errorf("fds/goroutines before New %+v, built %+v, queue running %+v: want 2 irqfds, then an ioeventfd and a worker", before, built, running)
	}
	if err := vm.QuiesceVirtio(t.Context()); err != nil {
		t.Fatalf("QuiesceVirtio: %v", err)
	}
	vm.ResumeVirtio()
	if err := vm.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	leaked := func(r resources) bool {
		return r.fds != before.fds || r.mappings != before.mappings || r.goroutines > before.goroutines
	}
	after := count(t)
	for leaked(after) && time.Now().Before(deadline) {
		runtime.Gosched()
		after = count(t)
	}
	if leaked(after) {
		t.Fatalf("after Close: %+v, before New: %+v", after, before)
	}
}

func TestNewReportsEveryConfigErrorAtOnce(t *testing.T) {
	kvmtest.Require(t)
	_, err := vmm.New(vmm.Config{Guest: "/nonexistent/guest.elf", VCPUs: 1 << 20})
	if err == nil {
		t.Fatal("New accepted the config")
	}
	for _, want := range []string{"memory: zero bytes", "reading guest file", "more than this host's KVM allows"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if joined, ok := err.(interface{ Unwrap() []error }); !ok || len(joined.Unwrap()) != 3 {
		t.Errorf("want three errors, got %q", err)
	}
}

// TestManyPausesOfASpinningGuestNeverHang pauses and resumes two spinning
// vCPUs many times: a lost kick would leave Pause waiting forever.
func TestManyPausesOfASpinningGuestNeverHang(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: writeGuest(t, "spin", tinyELF(spinCode)), VCPUs: 2})
	con := newConsole(t, vm)
	done := start(t, vm)
	con.waitFor("the spinning guest's x", func(string) bool { return true })
	cycles := make(chan error, 1)
	go func() {
		for range 200 {
			if err := vm.Pause(); err != nil {
				cycles <- err
				return
			}
			if err := vm.Resume(); err != nil {
				cycles <- err
				return
			}
		}
		cycles <- nil
	}()
	select {
	case err := <-cycles:
		if err != nil {
			t.Fatalf("pause/resume: %v", err)
		}
	case <-time.After(generous):
		t.Fatal("200 pause/resume cycles did not finish: a kick was lost")
	}
	vm.Stop()
	if r := wait(t, done); !errors.Is(r.err, vmm.ErrStopped) {
		t.Fatalf("Run = %d, %v; want ErrStopped", r.status, r.err)
	}
}

func TestRunAfterCloseIsAnError(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: "hello"})
	if err := vm.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := vm.Run(context.Background()); !errors.Is(err, vmm.ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
}
