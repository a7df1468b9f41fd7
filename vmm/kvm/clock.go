package kvm

import "fmt"

// Clock reads the VM's kvmclock (KVM_GET_CLOCK). Flags say which of
// Realtime and HostTSC are valid and whether the clock is TSC-stable.
func (vm *VM) Clock() (ClockData, error) {
	const op = "getting VM clock"
	var d ClockData
	if _, err := vm.requireVM(op, CapAdjustClock); err != nil {
		return d, err
	}
	fd, err := vm.rawFd()
	if err != nil {
		return d, err
	}
	if err := ioctlPtr(fd, kvmGetClock, &d); err != nil {
		return d, fmt.Errorf("%s: %w", op, err)
	}
	return d, nil
}

// SetClock sets the VM's kvmclock (KVM_SET_CLOCK). With ClockRealtime in
// d.Flags (and the host's support for it), KVM advances the clock by the
// realtime that passed since d.Realtime: the time a migration took.
func (vm *VM) SetClock(d ClockData) error {
	const op = "setting VM clock"
	if _, err := vm.requireVM(op, CapAdjustClock); err != nil {
		return err
	}
	fd, err := vm.rawFd()
	if err != nil {
		return err
	}
	// KVM_SET_CLOCK accepts only KVM_CLOCK_REALTIME as an input flag.
	d.Flags &= ClockRealtime
	if err := ioctlPtr(fd, kvmSetClock, &d); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

// TSCKHz returns the vCPU's TSC frequency in kHz (KVM_GET_TSC_KHZ).
func (c *VCPU) TSCKHz() (uint32, error) {
	op := fmt.Sprintf("getting TSC frequency of vCPU %d", c.id)
	fd, err := c.rawFd()
	if err != nil {
		return 0, err
	}
	khz, err := ioctl(fd, kvmGetTSCKHz, 0)
	if err != nil {
		return 0, opError(op, err, CapGetTSCKHz)
	}
	return uint32(khz), nil
}

// SetTSCKHz sets the vCPU's TSC frequency in kHz (KVM_SET_TSC_KHZ); KVM
// scales the guest's TSC where the host CPU can (KVM_CAP_TSC_CONTROL).
func (c *VCPU) SetTSCKHz(khz uint32) error {
	op := fmt.Sprintf("setting TSC frequency of vCPU %d to %d kHz", c.id, khz)
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	if _, err := ioctl(fd, kvmSetTSCKHz, uintptr(khz)); err != nil {
		return opError(op, err, CapTSCControl)
	}
	return nil
}
