package vcpu

import (
	"errors"
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"

	"tern/vmm/kvm"
)

// Errors that end a vCPU; test with errors.Is.
var (
	// ErrShutdown reports KVM_EXIT_SHUTDOWN: the guest triple-faulted (or
	// otherwise reset the CPU), which tern does not survive.
	ErrShutdown = errors.New("guest triple-faulted (KVM_EXIT_SHUTDOWN)")
	// ErrHalted reports a HLT with no way to wake: tern gives its guests
	// no interrupts, so a halted boot vCPU never runs again.
	ErrHalted = errors.New("vCPU halted with no interrupt to wake it")
	// ErrInternal reports KVM_EXIT_INTERNAL_ERROR, KVM_EXIT_FAIL_ENTRY or
	// an exit reason tern does not handle.
	ErrInternal = errors.New("KVM could not run the vCPU")
	// ErrNotRunning reports a Pause or Resume of a vCPU that has stopped
	// or ended.
	ErrNotRunning = errors.New("vCPU not running")
)

// Config is what a vCPU needs to run.
type Config struct {
	// Create makes the vCPU and sets its registers: it runs first thing
	// on the vCPU's own locked thread, so that every vCPU ioctl comes from
	// the thread that created the vCPU. The vCPU stays owned by its VM;
	// the goroutine only drives it.
	Create func() (*kvm.VCPU, error)
	// Ports and MMIO receive the IO and MMIO exits; nil buses claim
	// nothing.
	Ports *PortBus
	MMIO  *MMIOBus
	// WaitOnHLT makes HLT park the vCPU until Stop (an application
	// processor the guest never starts); otherwise HLT ends it with
	// ErrHalted.
	WaitOnHLT bool
	// StartPaused parks the vCPU before its first instruction, as if
	// Pause had been called; Resume starts it.
	StartPaused bool
}

// runState is what the controller asks of the vCPU goroutine.
type runState int

const (
	stateRunning runState = iota
	statePaused
	stateStopped
)

// VCPU is one running virtual CPU: its goroutine and the requests made of
// it. Its methods are safe for concurrent use.
//
// States, as the goroutine sees them:
//
//	running --Pause--> paused (parked) --Resume--> running
//	   |                  |
//	   +------Stop--------+----> stopped (goroutine ends, Wait returns nil)
//	running --SHUTDOWN, internal error, HLT--> ended (Wait returns why)
type VCPU struct {
	// Immutable after Start.
	cfg  Config
	cpu  *kvm.VCPU
	pid  int
	tid  int // the OS thread the goroutine is locked to
	done chan struct{}

	mu   sync.Mutex
	cond *sync.Cond // on mu: broadcast on every change below
	// want is the state asked for by Pause, Resume and Stop.
	want runState
	// parked is set while the goroutine waits in a pause, halted while it
	// waits at HLT (WaitOnHLT): either way it is not in KVM_RUN.
	parked, halted bool
	// exited is set, and err recorded, just before the goroutine ends.
	exited bool
	err    error

	// exits are the last exits from KVM_RUN, for a crash report; only the
	// goroutine touches them until it has ended (LastExits).
	exits exitHistory
}

// Start starts the vCPU's goroutine, which creates the vCPU (cfg.Create)
// on its locked thread and then runs the guest until Stop or an exit it
// cannot continue from. If Create fails, Start returns its error and the
// goroutine has ended. Otherwise the caller owns the goroutine through the
// returned VCPU: Stop ends it and Wait waits for it.
func Start(cfg Config) (*VCPU, error) {
	if cfg.Ports == nil {
		cfg.Ports = &PortBus{}
	}
	if cfg.MMIO == nil {
		cfg.MMIO = &MMIOBus{}
	}
	v := &VCPU{cfg: cfg, pid: unix.Getpid(), done: make(chan struct{})}
	v.cond = sync.NewCond(&v.mu)
	if cfg.StartPaused {
		v.want = statePaused
	}
	created := make(chan error)
	go v.loop(created)
	if err := <-created; err != nil {
		<-v.done
		return nil, err
	}
	return v, nil
}

// ID is the vCPU's index.
func (v *VCPU) ID() int { return v.cpu.ID() }

// KVM returns the vCPU's KVM handle, for inspecting or capturing its
// state. Use it only while the vCPU is paused (Pause returned nil and
// Resume was not called, or it started paused and was not resumed) or
// after Wait returned: only then is no thread inside KVM_RUN and the vCPU
// at an instruction boundary.
func (v *VCPU) KVM() *kvm.VCPU { return v.cpu }

// loop is the vCPU goroutine.
func (v *VCPU) loop(created chan<- error) {
	defer close(v.done)
	// Never unlocked: the thread is the vCPU's for its whole life and
	// exits with this goroutine (see doc.go).
	runtime.LockOSThread()
	v.tid = unix.Gettid()
	cpu, err := v.cfg.Create()
	if err != nil {
		created <- err
		return
	}
	v.cpu = cpu
	created <- nil
	err = v.run()
	v.mu.Lock()
	v.exited, v.err = true, err
	v.cond.Broadcast()
	v.mu.Unlock()
}

// run enters the guest and handles exits until Stop or an error.
func (v *VCPU) run() error {
	pending := false // the last exit's instruction is not yet complete
	for {
		if stop, err := v.checkpoint(&pending); stop {
			return err
		}
		exit, err := v.cpu.Run()
		if err != nil {
			return err
		}
		if exit != kvm.ExitIO && exit != kvm.ExitMMIO {
			v.exits.record(Exit{Reason: exit})
		}
		switch exit {
		case kvm.ExitIntr: // kicked: the checkpoint says why
		case kvm.ExitIO:
			if err := v.handleIO(); err != nil {
				return err
			}
			pending = true
		case kvm.ExitMMIO:
			if err := v.handleMMIO(); err != nil {
				return err
			}
			pending = true
		case kvm.ExitHLT:
			if !v.cfg.WaitOnHLT {
				return fmt.Errorf("vCPU %d at %s: %w", v.ID(), v.where(), ErrHalted)
			}
			v.waitHalted()
			return nil
		case kvm.ExitShutdown:
			return fmt.Errorf("vCPU %d at %s: %w", v.ID(), v.where(), ErrShutdown)
		case kvm.ExitInternalError:
			ie, err := v.cpu.InternalError()
			if err != nil {
				return err
			}
			return fmt.Errorf("vCPU %d at %s: %w: %v", v.ID(), v.where(), ErrInternal, ie)
		case kvm.ExitFailEntry:
			reason, err := v.cpu.FailEntryReason()
			if err != nil {
				return err
			}
			return fmt.Errorf("vCPU %d: %w: entry failed, hardware reason %#x", v.ID(), ErrInternal, reason)
		default:
			return fmt.Errorf("vCPU %d at %s: %w: unexpected exit %v", v.ID(), v.where(), ErrInternal, exit)
		}
	}
}

// where describes the vCPU's instruction pointer for an error message.
func (v *VCPU) where() string {
	r, err := v.cpu.Regs()
	if err != nil {
		return "unknown rip"
	}
	return fmt.Sprintf("rip %#x", r.RIP)
}

// checkpoint runs between exits and acts on the requests: it returns stop
// for Stop, parks for Pause until Resume, and otherwise clears
// immediate_exit (under mu, so no kick is lost) and lets the vCPU run on.
func (v *VCPU) checkpoint(pending *bool) (stop bool, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for {
		switch v.want {
		case stateStopped:
			return true, nil
		case stateRunning:
			v.cpu.SetImmediateExit(false)
			return false, nil
		}
		if *pending {
			// Complete the IO or MMIO instruction before parking:
			// immediate_exit is set, so KVM finishes it and returns.
			*pending = false
			v.mu.Unlock()
			exit, err := v.cpu.Run()
			v.mu.Lock()
			if err != nil {
				return true, err
			}
			if exit != kvm.ExitIntr {
				return true, fmt.Errorf("vCPU %d: %w: exit %v while completing an instruction for a pause", v.ID(), ErrInternal, exit)
			}
			continue
		}
		v.parked = true
		v.cond.Broadcast()
		for v.want == statePaused {
			v.cond.Wait()
		}
		v.parked = false
		v.cond.Broadcast()
	}
}

// waitHalted parks a halted vCPU until Stop.
func (v *VCPU) waitHalted() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.halted = true
	v.cond.Broadcast()
	for v.want != stateStopped {
		v.cond.Wait()
	}
}

func (v *VCPU) handleIO() error {
	io, err := v.cpu.IO()
	if err != nil {
		return err
	}
	v.exits.record(Exit{Reason: kvm.ExitIO, Write: io.Out, Addr: uint64(io.Port)})
	size := uint32(io.Size)
	for i := range io.Count {
		d := io.Data[i*size : (i+1)*size]
		if io.Out {
			v.cfg.Ports.Write(io.Port, d)
		} else {
			v.cfg.Ports.Read(io.Port, d)
		}
	}
	return nil
}

func (v *VCPU) handleMMIO() error {
	m, err := v.cpu.MMIO()
	if err != nil {
		return err
	}
	v.exits.record(Exit{Reason: kvm.ExitMMIO, Write: m.Write, Addr: m.Addr})
	if m.Write {
		v.cfg.MMIO.Write(m.Addr, m.Data)
	} else {
		v.cfg.MMIO.Read(m.Addr, m.Data)
	}
	return nil
}

// kickLocked makes the vCPU leave KVM_RUN (or not enter it) and come to
// its checkpoint: immediate_exit first, then the signal, so a signal that
// lands before KVM_RUN starts is not lost. The thread is alive: exited is
// set under mu before the goroutine (and so its locked thread) ends.
func (v *VCPU) kickLocked() {
	if v.exited {
		return
	}
	v.cpu.SetImmediateExit(true)
	// ESRCH is impossible here (see above); nothing else can fail.
	_ = unix.Tgkill(v.pid, v.tid, unix.SIGURG)
}

// Pause stops the vCPU at its next instruction boundary and returns once
// it is parked (or halted at HLT). It returns ErrNotRunning, or the error
// that ended it, when the vCPU is not running.
func (v *VCPU) Pause() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.notRunningLocked(); err != nil {
		return err
	}
	v.want = statePaused
	v.kickLocked()
	for !v.parked && !v.halted && !v.exited {
		v.cond.Wait()
	}
	if v.exited {
		return v.notRunningLocked()
	}
	return nil
}

// Resume lets a paused vCPU run on; resuming a running vCPU does nothing.
func (v *VCPU) Resume() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if err := v.notRunningLocked(); err != nil {
		return err
	}
	v.want = stateRunning
	v.cond.Broadcast()
	return nil
}

// WaitUnparked waits until the goroutine has left a pause that Resume
// ended: the vCPU is on its way back into KVM_RUN (or has ended, or was
// paused or stopped again meanwhile). It returns at once when the vCPU is
// not parked.
func (v *VCPU) WaitUnparked() {
	v.mu.Lock()
	defer v.mu.Unlock()
	for v.parked && v.want == stateRunning && !v.exited {
		v.cond.Wait()
	}
}

func (v *VCPU) notRunningLocked() error {
	switch {
	case v.exited && v.err != nil:
		return fmt.Errorf("%w: %w", ErrNotRunning, v.err)
	case v.exited || v.want == stateStopped:
		return ErrNotRunning
	}
	return nil
}

// Stop asks the vCPU to end, without waiting; Wait waits. Stopping twice,
// or after the vCPU ended, does nothing.
func (v *VCPU) Stop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.want == stateStopped {
		return
	}
	v.want = stateStopped
	v.kickLocked()
	v.cond.Broadcast()
}

// Done is closed when the vCPU's goroutine has ended.
func (v *VCPU) Done() <-chan struct{} { return v.done }

// Wait waits for the goroutine to end and returns why it ended: nil after
// Stop, otherwise the exit or error that ended it.
func (v *VCPU) Wait() error {
	<-v.done
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.err
}
