package vmm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"tern/vmm/devices"
	"tern/vmm/vcpu"
)

// stopVCPUs asks every running vCPU to stop, without waiting.
func (vm *VM) stopVCPUs() {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	for _, v := range vm.vcpus {
		v.Stop()
	}
}

// Run lets the vCPUs run (unless Pause was called before) and waits until the guest writes its status to
// port 0xf4, Stop is called, ctx ends, or a vCPU fails; see doc.go for
// what it returns. Every vCPU goroutine has ended when it returns. A VM
// runs once.
func (vm *VM) Run(ctx context.Context) (status uint32, err error) {
	vm.mu.Lock()
	switch {
	case vm.closed:
		vm.mu.Unlock()
		return 0, ErrClosed
	case vm.ran:
		vm.mu.Unlock()
		return 0, ErrAlreadyRan
	}
	vm.ran = true
	running := vm.vcpus
	if !vm.startPaused {
		for _, v := range running {
			v.Resume() // parked since New: cannot fail
		}
	}
	vm.mu.Unlock()
	vm.note("running")
	vm.log.Debug("VM running", "vcpus", len(running))

	ended := make(chan *vcpu.VCPU, len(running))
	var watchers sync.WaitGroup
	for _, v := range running {
		watchers.Go(func() {
			<-v.Done()
			ended <- v
		})
	}
	var cause error
	var powered <-chan struct{} // nil for tern's own guests: never ready
	if vm.power != nil {
		powered = vm.power.Done()
	}
	select {
	case <-vm.debugExit.Done():
	case <-powered:
		cause = vm.powerErr()
	case <-vm.stopReq:
		cause = ErrStopped
	case <-ctx.Done():
		cause = fmt.Errorf("running VM: %w", context.Cause(ctx))
	case v := <-ended:
		cause = v.Wait()
	}
	vm.stopVCPUs()
	var errs []error
	for _, v := range running {
		if err := v.Wait(); err != nil && !errors.Is(cause, err) {
			errs = append(errs, err)
		}
	}
	watchers.Wait()
	if isCrash(cause) {
		cause = &CrashError{Err: cause, Report: vm.crashReport(running)}
		vm.log.Error("VM crashed", "err", cause)
	}
	if s, ok := vm.debugExit.Status(); ok {
		vm.log.Debug("guest exited", "status", s)
		return s, nil
	}
	if cause == nil {
		// A vCPU ended without an error: Stop, or a power register
		// whose stop that vCPU saw before Run did.
		if cause = vm.powerErr(); cause == nil {
			cause = ErrStopped
		}
	}
	return 0, errors.Join(append([]error{cause}, errs...)...)
}

// Pause parks every vCPU at an instruction boundary and stops the network
// cards writing received frames into guest memory, and returns once all
// are parked. Before Run it makes Run start them parked. If one cannot
// pause (it ended), the others are resumed and its error returned.
func (vm *VM) Pause() error {
	vm.setPaused(true)
	vm.pauseNICs()
	running, err := vm.requestBeforeRun(true)
	if running == nil || err != nil {
		if err != nil {
			vm.resumeNICs()
			vm.setPaused(false)
		}
		return err
	}
	for i, v := range running {
		if err := v.Pause(); err != nil {
			for _, p := range running[:i] {
				p.Resume()
			}
			vm.resumeNICs()
			vm.setPaused(false)
			return fmt.Errorf("pausing VM: %w", err)
		}
	}
	vm.note("paused")
	return nil
}

// Resume lets every paused vCPU run on; before Run it undoes a Pause.
func (vm *VM) Resume() error {
	running, err := vm.requestBeforeRun(false)
	if err != nil {
		return err
	}
	defer vm.setPaused(false)
	vm.resumeNICs()
	if running == nil {
		return nil
	}
	var errs []error
	for _, v := range running {
		if err := v.Resume(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("resuming VM: %w", err)
	}
	vm.note("resumed")
	return nil
}

// WaitResumed waits until every vCPU a Resume let go has left its pause
// (vcpu.VCPU.WaitUnparked): what a migration target counts as its guest
// running again. Before Run it returns at once.
func (vm *VM) WaitResumed() {
	for _, v := range vm.VCPUs() {
		v.WaitUnparked()
	}
}

// setPaused records whether the vCPUs are (being) paused.
func (vm *VM) setPaused(p bool) {
	vm.mu.Lock()
	vm.paused = p
	vm.mu.Unlock()
}

// guestRunning reports whether the vCPUs run: after Run and not paused.
func (vm *VM) guestRunning() bool {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.ran && !vm.paused && !vm.closed
}

// requestBeforeRun records a Pause (paused) or Resume before Run and
// returns nil vCPUs; once Run started them it returns them instead.
func (vm *VM) requestBeforeRun(paused bool) ([]*vcpu.VCPU, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if vm.closed {
		return nil, ErrClosed
	}
	if !vm.ran {
		vm.startPaused = paused
		return nil, nil
	}
	return vm.vcpus, nil
}

// Stop makes Run end with ErrStopped (unless the guest already exited);
// it does not wait. Safe from any goroutine, before or during Run.
func (vm *VM) Stop() {
	vm.stopOnce.Do(func() { close(vm.stopReq) })
	vm.stopVCPUs()
}

// powerErr is Run's error for what the guest asked of its power
// registers, nil if nothing.
func (vm *VM) powerErr() error {
	if vm.power == nil {
		return nil
	}
	switch vm.power.Event() {
	case devices.PowerOff:
		return ErrPoweredOff
	case devices.PowerReset:
		return ErrGuestReset
	}
	return nil
}
