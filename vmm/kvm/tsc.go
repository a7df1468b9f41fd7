package kvm

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The vCPU device attribute that holds the guest's TSC offset (Linux
// 5.16 on: KVM_VCPU_TSC_CTRL, KVM_VCPU_TSC_OFFSET).
const (
	kvmSetDeviceAttr = 0x4018AEE1 // _IOW(KVMIO, 0xe1, struct kvm_device_attr)
	kvmGetDeviceAttr = 0x4018AEE2 // _IOW(KVMIO, 0xe2, struct kvm_device_attr)

	vcpuTSCCtrl   = 0 // KVM_VCPU_TSC_CTRL
	vcpuTSCOffset = 0 // KVM_VCPU_TSC_OFFSET
)

// deviceAttr is struct kvm_device_attr.
type deviceAttr struct {
	Flags uint32
	Group uint32
	Attr  uint64
	Addr  uint64
}

// TSCOffset reads the vCPU's TSC offset: the guest's TSC is the host's
// (scaled) plus it. ErrNotSupported on a KVM without the attribute.
func (c *VCPU) TSCOffset() (uint64, error) {
	var off uint64
	if err := c.tscOffsetAttr(kvmGetDeviceAttr, &off); err != nil {
		return 0, fmt.Errorf("getting TSC offset of vCPU %d: %w", c.id, err)
	}
	return off, nil
}

// SetTSCOffset sets the vCPU's TSC offset, which moves its TSC by the
// difference at once, with none of the matching KVM applies to a written
// TSC value (see settleTSC).
func (c *VCPU) SetTSCOffset(off uint64) error {
	if err := c.tscOffsetAttr(kvmSetDeviceAttr, &off); err != nil {
		return fmt.Errorf("setting TSC offset of vCPU %d: %w", c.id, err)
	}
	return nil
}

func (c *VCPU) tscOffsetAttr(request uintptr, off *uint64) error {
	fd, err := c.rawFd()
	if err != nil {
		return err
	}
	a := deviceAttr{Group: vcpuTSCCtrl, Attr: vcpuTSCOffset, Addr: uint64(uintptr(unsafe.Pointer(off)))}
	err = ioctlPtr(fd, request, &a)
	if errors.Is(err, unix.ENXIO) || errors.Is(err, unix.ENOTTY) {
		return ErrNotSupported
	}
	return err
}

// tscSettleSlackMs is how far ahead a TSC read back just after it was
// written may be of the value written: more than the microseconds between
// the two ioctls, far less than the second within which KVM matches a
// written value.
const tscSettleSlackMs = 50

// settleTSC makes the vCPU's TSC want, as KVM_SET_MSRS was asked to. Until
// Linux 6.10 KVM takes a TSC written within a second of what it expects
// (the VM's last written TSC plus the time since) as an attempt to
// synchronise the vCPUs, and keeps its own value instead. A restored
// guest whose TSC is within a second of a fresh VM's (a guest migrated
// soon after it started, as tests do) would see its clock jump back. So
// the TSC is read back, and where the write did not take, the offset is
// moved by what is missing. Without the offset attribute (before Linux
// 5.16) the TSC stays as KVM left it.
func (c *VCPU) settleTSC(want uint64, khz uint32) error {
	got, err := c.MSRs([]uint32{MSRIA32TSC})
	if err != nil {
		return err
	}
	if len(got) != 1 {
		return nil // KVM refused to read it; SetMSRs did not refuse it
	}
	slack := uint64(tscSettleSlackMs) * uint64(max(khz, 1_000_000)) // kHz: ticks a ms
	if ahead := got[0].Data - want; ahead <= slack {
		return nil // the write took (the TSC ran on for a few µs since)
	}
	off, err := c.TSCOffset()
	if errors.Is(err, ErrNotSupported) {
		return nil
	}
	if err != nil {
		return err
	}
	return c.SetTSCOffset(off + (want - got[0].Data))
}
