package vmm_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"tern/vmm"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxtest"
)

// TestMain runs the package here or in the emulated test host; there the
// Linux guests' tests get a two-CPU host of their own: on one CPU a
// running Linux guest leaves the emulated kernel nothing for anything
// else, and the machine stalled (no heartbeat for 90 s) twice in a row
// in a whole-package run (docs/reliability.md).
func TestMain(m *testing.M) {
	kvmtest.Main(m, kvmtest.WithPrepare(linuxtest.PrepareWithVmlinux), kvmtest.WithPrepare(linuxtest.PrepareUserland),
		kvmtest.WithEmulatedCPUsFor(2, "Linux|Vmlinux"))
}

// generous bounds every wait: the machines are busy and the emulated test
// host is slow; nothing asserts on time.
const generous = 2 * time.Minute

// linuxBoot bounds a Linux guest's boot to init: inside the emulated test
// host a stock kernel's CPL0 code runs under nested KVM on TCG, and with
// the rest of the suite on the same two cores a quiet boot there has taken
// over two minutes.
func linuxBoot() time.Duration { return kvmtest.Sized(generous, 8*time.Minute) }

// newVM builds a VM from cfg (128 MiB unless set) and closes it with the
// test.
func newVM(t *testing.T, cfg vmm.Config) *vmm.VM {
	t.Helper()
	if cfg.MemoryBytes == 0 && cfg.Regions == nil {
		cfg.MemoryBytes = 128 << 20
	}
	vm, err := vmm.New(cfg)
	if err != nil {
		t.Fatalf("vmm.New: %v", err)
	}
	t.Cleanup(func() {
		if err := vm.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return vm
}

// runResult is what Run returned.
type runResult struct {
	status uint32
	err    error
}

// start runs vm in a goroutine the test owns; the returned channel gets
// Run's result. The cleanup stops the VM and waits for Run.
func start(t *testing.T, vm *vmm.VM) <-chan runResult {
	t.Helper()
	return startWithin(t, vm, generous)
}

// startWithin is start with Run bounded by limit.
func startWithin(t *testing.T, vm *vmm.VM, limit time.Duration) <-chan runResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	done := make(chan runResult, 1)
	go func() {
		s, err := vm.Run(ctx)
		done <- runResult{s, err}
	}()
	t.Cleanup(func() {
		vm.Stop()
		cancel()
	})
	return done
}

// wait returns Run's result or fails the test after the generous bound.
func wait(t *testing.T, done <-chan runResult) runResult {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(generous + time.Minute):
		t.Fatal("Run did not return")
		return runResult{}
	}
}

// console reads the serial output line by line.
type console struct {
	t    *testing.T
	h    *devices.History
	sub  *devices.Subscription
	off  uint64
	part string
	seen []string
	// wait bounds each waitFor; zero means generous.
	wait time.Duration
}

func (c *console) limit() time.Duration {
	if c.wait > 0 {
		return c.wait
	}
	return generous
}

func newConsole(t *testing.T, vm *vmm.VM) *console {
	c := &console{t: t, h: vm.Serial().Output()}
	c.sub = c.h.Subscribe()
	t.Cleanup(c.sub.Close)
	return c
}

// next returns the next complete line (without CR LF), waiting for it.
func (c *console) next(deadline <-chan time.Time) (string, bool) {
	for {
		if i := strings.IndexByte(c.part, '\n'); i >= 0 {
			line := strings.TrimRight(c.part[:i], "\r")
			c.part = c.part[i+1:]
			c.seen = append(c.seen, line)
			return line, true
		}
		data, _, next, err := c.h.ReadFrom(c.off, 1<<16)
		if err != nil {
			c.t.Fatalf("reading serial output: %v", err)
		}
		c.off = next
		if len(data) > 0 {
			c.part += string(data)
			continue
		}
		select {
		case <-c.sub.C():
		case <-deadline:
			return "", false
		}
	}
}

// waitFor returns the first line for which match is true, failing the
// test (with what the guest printed) if none comes within the bound.
func (c *console) waitFor(what string, match func(string) bool) string {
	c.t.Helper()
	deadline := time.After(c.limit())
	for {
		line, ok := c.next(deadline)
		if !ok {
			c.t.Fatalf("no %s on the serial console; it printed %q", what, c.seen)
		}
		if match(line) {
			return line
		}
	}
}

func (c *console) waitLine(want string) {
	c.t.Helper()
	c.waitFor(strings.TrimSpace(want), func(l string) bool { return l == want })
}

func TestHelloPrintsItsLineAndExitsZero(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: "hello"})
	con := newConsole(t, vm)
	r := wait(t, start(t, vm))
	if r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0, nil", r.status, r.err)
	}
	con.waitLine(guests.HelloLine)
	if _, ok := vm.BootTimer().Elapsed(); !ok {
		t.Error("the boot timer saw no magic write")
	}
}

func TestHelloWithTwoVCPUsExitsZero(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: "hello", VCPUs: 2})
	con := newConsole(t, vm)
	r := wait(t, start(t, vm))
	if r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0, nil", r.status, r.err)
	}
	con.waitLine(guests.HelloLine)
}

func TestRunTwiceIsAnError(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: "hello"})
	wait(t, start(t, vm))
	if _, err := vm.Run(context.Background()); !errors.Is(err, vmm.ErrAlreadyRan) {
		t.Fatalf("second Run = %v, want ErrAlreadyRan", err)
	}
}

// TestHelloFaultsOnPurposeAndReportsTheException makes hello raise each
// exception it can at CPL3: its handler prints the exception line and
// exits with 0x40 + vector, which Run returns as the status.
func TestHelloFaultsOnPurposeAndReportsTheException(t *testing.T) {
	kvmtest.Require(t)
	for _, c := range []struct {
		name   string
		fault  uint64
		vector uint8
	}{
		{"divide", guests.HelloFaultDivide, 0},
		{"invalid opcode", guests.HelloFaultInvalidOp, 6},
		{"non-canonical", guests.HelloFaultNonCanonical, 13},
		{"page fault", guests.HelloFaultPage, 14},
		{"denied port", guests.HelloFaultPort, 13},
	} {
		t.Run(c.name, func(t *testing.T) {
			vm := newVM(t, vmm.Config{Guest: "hello", Params: &guests.Params{HelloFault: c.fault}})
			con := newConsole(t, vm)
			r := wait(t, start(t, vm))
			if want := uint32(guests.ExceptionStatus(c.vector)); r.err != nil || r.status != want {
				t.Fatalf("Run = %#x, %v; want %#x, nil", r.status, r.err, want)
			}
			con.waitLine(guests.HelloLine)
			con.waitFor("the exception line", func(l string) bool { return strings.HasPrefix(l, guests.ExceptionPrefix) })
		})
	}
}
