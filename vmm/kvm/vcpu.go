package kvm

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// VCPU is one virtual CPU: its fd and its mmap'd kvm_run page. A VCPU is
// driven from one goroutine locked to its OS thread (see the package doc).
type VCPU struct {
	// Immutable after CreateVCPU.
	id int

	mu  sync.Mutex
	fd  int    // guarded by mu; -1 after Close
	run []byte // guarded by mu; the kvm_run mapping, nil after Close
}

// ID is the vCPU's index given to CreateVCPU.
func (c *VCPU) ID() int { return c.id }

func (c *VCPU) rawFd() (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return -1, ErrClosed
	}
	return c.fd, nil
}

// Regs reads the general-purpose registers (KVM_GET_REGS).
func (c *VCPU) Regs() (Regs, error) {
	var r Regs
	fd, err := c.rawFd()
	if err != nil {
		return r, err
	}
	if err := ioctlPtr(fd, kvmGetRegs, &r); err != nil {
		return r, fmt.Errorf("getting registers of vCPU %d: %w", c.id, err)
	}
	return r, nil
}

// SetRegs writes the general-purpose registers (KVM_SET_REGS).
func (c *VCPU) SetRegs(r Regs) error {
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	if err := ioctlPtr(fd, kvmSetRegs, &r); err != nil {
		return fmt.Errorf("setting registers of vCPU %d: %w", c.id, err)
	}
	return nil
}

// Sregs reads the special registers (KVM_GET_SREGS).
func (c *VCPU) Sregs() (Sregs, error) {
	var s Sregs
	fd, err := c.rawFd()
	if err != nil {
		return s, err
	}
	if err := ioctlPtr(fd, kvmGetSregs, &s); err != nil {
		return s, fmt.Errorf("getting special registers of vCPU %d: %w", c.id, err)
	}
	return s, nil
}

// SetSregs writes the special registers (KVM_SET_SREGS).
func (c *VCPU) SetSregs(s Sregs) error {
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	if err := ioctlPtr(fd, kvmSetSregs, &s); err != nil {
		return fmt.Errorf("setting special registers of vCPU %d: %w", c.id, err)
	}
	return nil
}

// SetCPUID2 sets the CPUID leaves the guest sees (KVM_SET_CPUID2).
func (c *VCPU) SetCPUID2(entries []CPUIDEntry2) error {
	if len(entries) == 0 {
		return fmt.Errorf("setting CPUID of vCPU %d: no entries", c.id)
	}
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	if err := ioctlBytes(fd, kvmSetCPUID2, cpuidPack(entries)); err != nil {
		return fmt.Errorf("setting CPUID of vCPU %d: %w", c.id, err)
	}
	return nil
}

// Run enters the guest (KVM_RUN) until an exit that user space must
// handle, and returns its reason.
//
// KVM_RUN interrupted by a signal (EINTR) is retried and never reported:
// Go's runtime preempts threads with SIGURG. The one exception is a kick:
// when the immediate_exit byte is set (SetImmediateExit), KVM_RUN returns
// EINTR at once, and Run reports that as ExitIntr, so the caller can look
// at why it was kicked. The caller clears the byte before running on.
//
// KVM_RUN of an application processor that waits for its start-up IPI
// (KVM_MP_STATE_UNINITIALIZED, where every vCPU but the first starts with
// the in-kernel irqchip) blocks in the kernel until INIT/SIPI, a signal
// or a kick, and returns EAGAIN once the SIPI made it runnable: Run
// enters it again, now at the SIPI's vector.
func (c *VCPU) Run() (ExitReason, error) {
	fd, err := c.rawFd()
	if err != nil {
		return 0, err
	}
	for {
		_, err := ioctl(fd, kvmRun, 0)
		if errors.Is(err, unix.EINTR) {
			if c.ImmediateExit() {
				return ExitIntr, nil
			}
			continue
		}
		if errors.Is(err, unix.EAGAIN) {
			continue // started by a SIPI (see above)
		}
		if err != nil {
			return 0, fmt.Errorf("running vCPU %d: %w", c.id, err)
		}
		return c.ExitReason(), nil
	}
}

// immediateExitWord is the aligned 32-bit word of kvm_run holding
// request_interrupt_window (byte 0, which tern never sets) and
// immediate_exit (byte 1). The kernel only reads this word, so it is
// changed with atomic bit operations from any thread.
func (c *VCPU) immediateExitWord() *uint32 { return view[uint32](c.runPage(), 0) }

// immediateExitBit is immediate_exit's lowest bit within the word, on a
// little-endian machine.
const immediateExitBit = 1 << 8

// SetImmediateExit sets or clears kvm_run's immediate_exit byte. While it
// is set, KVM_RUN returns EINTR without entering the guest (after
// completing a pending IO or MMIO instruction), which Run reports as
// ExitIntr. Safe to call from any goroutine: with a signal sent to the
// vCPU's thread it kicks a running vCPU out of KVM_RUN without a race (a
// signal that arrives before KVM_RUN starts is caught by the byte).
func (c *VCPU) SetImmediateExit(on bool) {
	if on {
		atomic.OrUint32(c.immediateExitWord(), immediateExitBit)
	} else {
		atomic.AndUint32(c.immediateExitWord(), ^uint32(immediateExitBit))
	}
}

// ImmediateExit reports whether kvm_run's immediate_exit byte is set.
func (c *VCPU) ImmediateExit() bool {
	return atomic.LoadUint32(c.immediateExitWord())&immediateExitBit != 0
}

// TSCkHz returns the vCPU's TSC frequency in kHz (KVM_GET_TSC_KHZ).
func (c *VCPU) TSCkHz() (uint32, error) {
	fd, err := c.rawFd()
	if err != nil {
		return 0, err
	}
	khz, err := ioctl(fd, kvmGetTSCkHz, 0)
	if err != nil {
		return 0, fmt.Errorf("getting TSC frequency of vCPU %d: %w", c.id, err)
	}
	return uint32(khz), nil
}

// InternalError describes a KVM_EXIT_INTERNAL_ERROR exit.
type InternalError struct {
	// Suberror is KVM_INTERNAL_ERROR_* (1 emulation, 2 simultaneous
	// exceptions, 3 delivery event, 4 unexpected exit reason).
	Suberror uint32
	// Data is the suberror's detail words.
	Data []uint64
}

// Error describes the internal error.
func (e InternalError) Error() string {
	name := map[uint32]string{1: "emulation failure", 2: "exception during exception delivery",
		3: "delivery event failed", 4: "unexpected exit reason"}[e.Suberror]
	if name == "" {
		name = "suberror " + itoa(uint64(e.Suberror))
	}
	return fmt.Sprintf("KVM internal error: %s, data %#x", name, e.Data)
}

// InternalError returns the details of the last exit, which must have
// been ExitInternalError.
func (c *VCPU) InternalError() (InternalError, error) {
	run := c.runPage()
	if r := ExitReason(view[runHeader](run, 0).ExitReason); r != ExitInternalError {
		return InternalError{}, fmt.Errorf("reading internal error of vCPU %d: last exit was %v", c.id, r)
	}
	e := view[internalErrorExit](run, runExitOffset)
	n := min(e.Ndata, uint32(len(e.Data)))
	return InternalError{Suberror: e.Suberror, Data: append([]uint64(nil), e.Data[:n]...)}, nil
}

// FailEntryReason returns hardware_entry_failure_reason of the last exit,
// which must have been ExitFailEntry.
func (c *VCPU) FailEntryReason() (uint64, error) {
	run := c.runPage()
	if r := ExitReason(view[runHeader](run, 0).ExitReason); r != ExitFailEntry {
		return 0, fmt.Errorf("reading entry failure of vCPU %d: last exit was %v", c.id, r)
	}
	return *view[uint64](run, runExitOffset), nil
}

// ExitReason is the reason of the last exit, read from kvm_run.
func (c *VCPU) ExitReason() ExitReason {
	return ExitReason(view[runHeader](c.runPage(), 0).ExitReason)
}

// runPage returns the kvm_run mapping; it panics after Close, which a
// caller that still runs the vCPU has broken.
func (c *VCPU) runPage() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.run == nil {
		panic("kvm: vCPU used after Close")
	}
	return c.run
}

// IO describes a KVM_EXIT_IO exit. Data aliases kvm_run: for an OUT it
// holds the bytes the guest wrote; for an IN the handler fills it before
// the next Run.
type IO struct {
	Port uint16
	// Out is true for OUT, false for IN.
	Out bool
	// Size is the bytes per access (1, 2 or 4).
	Size uint8
	// Count is the accesses (more than 1 for a REP string instruction).
	Count uint32
	// Data is Size*Count bytes inside the kvm_run page.
	Data []byte
}

// IO returns the details of the last exit, which must have been ExitIO.
func (c *VCPU) IO() (IO, error) {
	run := c.runPage()
	if r := ExitReason(view[runHeader](run, 0).ExitReason); r != ExitIO {
		return IO{}, fmt.Errorf("reading IO exit of vCPU %d: last exit was %v", c.id, r)
	}
	e := view[ioExit](run, runExitOffset)
	n := uint64(e.Size) * uint64(e.Count)
	if e.DataOffset+n > uint64(len(run)) || e.DataOffset < runHeaderSize {
		return IO{}, fmt.Errorf("reading IO exit of vCPU %d: data at %d+%d outside kvm_run", c.id, e.DataOffset, n)
	}
	return IO{
		Port:  e.Port,
		Out:   e.Direction == IODirOut,
		Size:  e.Size,
		Count: e.Count,
		Data:  run[e.DataOffset : e.DataOffset+n : e.DataOffset+n],
	}, nil
}

// MMIO describes a KVM_EXIT_MMIO exit. For a read the handler fills Data
// (which aliases kvm_run) before the next Run.
type MMIO struct {
	Addr  uint64
	Write bool
	Data  []byte
}

// MMIO returns the details of the last exit, which must have been ExitMMIO.
func (c *VCPU) MMIO() (MMIO, error) {
	run := c.runPage()
	if r := ExitReason(view[runHeader](run, 0).ExitReason); r != ExitMMIO {
		return MMIO{}, fmt.Errorf("reading MMIO exit of vCPU %d: last exit was %v", c.id, r)
	}
	e := view[mmioExit](run, runExitOffset)
	n := min(e.Len, uint32(len(e.Data)))
	return MMIO{Addr: e.PhysAddr, Write: e.IsWrite != 0, Data: e.Data[:n:n]}, nil
}

// Close unmaps kvm_run and closes the vCPU fd. Closing twice is a no-op.
func (c *VCPU) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fd < 0 {
		return nil
	}
	var errs []error
	if err := unix.Munmap(c.run); err != nil {
		errs = append(errs, fmt.Errorf("unmapping kvm_run of vCPU %d: %w", c.id, err))
	}
	c.run = nil
	if err := unix.Close(c.fd); err != nil {
		errs = append(errs, fmt.Errorf("closing vCPU %d: %w", c.id, err))
	}
	c.fd = -1
	return errors.Join(errs...)
}
