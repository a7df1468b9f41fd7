package vcpu

import (
	"errors"
	"runtime"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tern/vmm/kvm"
	"tern/vmm/kvm/kvmtest"
)

func TestMain(m *testing.M) { kvmtest.Main(m) }

// counterPort answers each IN with the next value of a counter. Every
// pauseEvery reads (pauses times) it asks for a pause from another
// goroutine while the vCPU is still in this exit, and returns only once
// the request is visible (immediate_exit set): so the vCPU reaches its
// checkpoint with the IN not yet completed, the case a pause must handle.
type counterPort struct {
	// Immutable after construction.
	pauseEvery int
	results    chan error // Pause's results, one per pause asked for

	mu     sync.Mutex
	v      *VCPU // set once the vCPU started
	last   uint8
	reads  int
	pauses int
}

func (c *counterPort) ReadPort(_ uint16, data []byte) {
	c.mu.Lock()
	c.last++
	data[0] = c.last
	c.reads++
	v := c.v
	pause := v != nil && v.KVM() != nil && c.reads%c.pauseEvery == 0 && c.pauses < cap(c.results)
	if pause {
		c.pauses++
	}
	c.mu.Unlock()
	if !pause {
		return
	}
	go func() { c.results <- v.Pause() }()
	// Wait (briefly: Pause sets it first thing) for the request to land.
	deadline := time.Now().Add(time.Minute)
	for !v.KVM().ImmediateExit() && time.Now().Before(deadline) {
		runtime.Gosched()
	}
}

func (c *counterPort) WritePort(uint16, []byte) {}

func (c *counterPort) lastValue() uint8 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// newRealModeVCPU returns a Create function for a vCPU that runs code in
// real mode at 0x1000.
func newRealModeVCPU(t *testing.T, code []byte) func() (*kvm.VCPU, error) {
	t.Helper()
	sys, err := kvm.Open()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sys.Close() })
	vm, err := sys.CreateVM()
	if err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) }) // after vm.Close: cleanups run last first
	t.Cleanup(func() { vm.Close() })
	copy(mem, code)
	if err := vm.SetUserMemoryRegion(kvm.MemoryRegion{GuestPhysAddr: 0x1000, Memory: mem}); err != nil {
		t.Fatal(err)
	}
	return func() (*kvm.VCPU, error) {
		cpu, err := vm.CreateVCPU(0)
		if err != nil {
			return nil, err
		}
		return cpu, kvm.StartRealMode(cpu, 0x1000)
	}
}

// TestPauseCompletesThePendingIN pauses a guest that reads a port in a
// loop (in al, 0x80; jmp back) while it is in an IN exit: once paused, its
// AL must hold the value the device returned, because a pause completes
// the IN of the last exit before it parks, so the state seen through KVM()
// is at an instruction boundary.
func TestPauseCompletesThePendingIN(t *testing.T) {
	kvmtest.Require(t)
	dev := &counterPort{pauseEvery: 10, results: make(chan error, 20)}
	var ports PortBus
	if err := ports.Register("counter", 0x80, 1, dev); err != nil {
		t.Fatal(err)
	}
	v, err := Start(Config{Create: newRealModeVCPU(t, []byte{0xe4, 0x80, 0xeb, 0xfc}), Ports: &ports, StartPaused: true})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		v.Stop()
		if err := v.Wait(); err != nil {
			t.Errorf("Wait after Stop = %v, want nil", err)
		}
	}()
	dev.mu.Lock()
	dev.v = v
	dev.mu.Unlock()
	if err := v.Resume(); err != nil {
		t.Fatal(err)
	}
	for i := range cap(dev.results) {
		select {
		case err := <-dev.results:
			if err != nil {
				t.Fatalf("Pause %d: %v", i, err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("pause %d never came", i)
		}
		regs, err := v.KVM().Regs()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := uint8(regs.RAX), dev.lastValue(); got != want {
			t.Fatalf("pause %d: AL = %d, the device returned %d: the IN was not completed", i, got, want)
		}
		if err := v.Resume(); err != nil {
			t.Fatalf("Resume %d: %v", i, err)
		}
	}
}

// TestShutdownEndsTheVCPU runs ud2 in real mode with no IDT: a triple
// fault, which ends the goroutine with ErrShutdown; Pause then reports it.
func TestShutdownEndsTheVCPU(t *testing.T) {
	kvmtest.Require(t)
	// Real mode has an IVT at 0, which reads as zeros here (unbacked),
	// so load an empty IDT first: lidt [0x1010] with a zero limit there.
	code := make([]byte, 0x20)
	copy(code, []byte{0x0f, 0x01, 0x1e, 0x10, 0x10, 0x0f, 0x0b}) // lidt [0x1010]; ud2
	v, err := Start(Config{Create: newRealModeVCPU(t, code)})
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Wait(); !errors.Is(err, ErrShutdown) {
		t.Fatalf("Wait = %v, want ErrShutdown", err)
	}
	if err := v.Pause(); !errors.Is(err, ErrNotRunning) || !errors.Is(err, ErrShutdown) {
		t.Fatalf("Pause after a shutdown = %v, want ErrNotRunning wrapping ErrShutdown", err)
	}
	v.Stop() // after the end: nothing to do
}

// TestCreateRunsOnTheVCPUThreadAndItsErrorEndsStart checks that Create
// runs on the thread the vCPU is kicked on, and that its error is Start's.
func TestCreateRunsOnTheVCPUThreadAndItsErrorEndsStart(t *testing.T) {
	kvmtest.Require(t)
	var createTid int
	create := newRealModeVCPU(t, []byte{0xeb, 0xfe})
	v, err := Start(Config{Create: func() (*kvm.VCPU, error) {
		createTid = unix.Gettid()
		return create()
	}, StartPaused: true})
	if err != nil {
		t.Fatal(err)
	}
	if createTid != v.tid {
		t.Errorf("Create ran on thread %d, the vCPU's is %d", createTid, v.tid)
	}
	v.Stop()
	if err := v.Wait(); err != nil {
		t.Errorf("Wait = %v", err)
	}
	failed := errors.New("no vCPU today")
	if _, err := Start(Config{Create: func() (*kvm.VCPU, error) { return nil, failed }}); !errors.Is(err, failed) {
		t.Errorf("Start with a failing Create = %v, want its error", err)
	}
}
