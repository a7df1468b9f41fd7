package vmm

import (
	"context"
	"errors"
	"fmt"

	"tern/vmm/devices"
	"tern/vmm/kvm"
)

// A Linux guest's virtio devices interrupt and are notified without the
// VMM's vCPU loop:
//
//   - Each device's Interrupt is an irqfd: an eventfd KVM watches, bound to
//     the slot's IOAPIC pin (VirtioSlotGSI). Trigger writes 1 to it and KVM
//     pulses the edge-triggered line, from whatever goroutine completed
//     the request.
//   - Each queue's QueueNotify write (the queue's index, 4 bytes, at
//     VirtioSlotAddr+devices.QueueNotifyOffset) is an ioeventfd: KVM
//     matches it in the kernel and signals an eventfd instead of exiting
//     to user space, and the queue's worker goroutine (vmm/devices), which
//     waits on that eventfd, serves the queue. The ioeventfd is assigned
//     when the driver has made the queue ready on a running device and
//     deassigned on reset, QueueReady 0 and Close.
//
// tern's own guests keep the synchronous path: they poll the used ring,
// take no interrupt, and the migration of them relies on a notification
// being served to the end on the notifying vCPU.

// irqfd is a devices.Interrupt that raises a GSI of the in-kernel irqchip
// through an eventfd KVM watches (KVM_IRQFD).
type irqfd struct {
	// Immutable after newIRQFD.
	vm  *kvm.VM
	efd *kvm.EventFD
	gsi uint32
}

var _ devices.Interrupt = (*irqfd)(nil)

// newIRQFD creates an eventfd and binds it to gsi.
func newIRQFD(vm *kvm.VM, gsi uint32) (*irqfd, error) {
	efd, err := kvm.NewEventFD()
	if err != nil {
		return nil, err
	}
	if err := vm.AssignIRQFD(efd.Fd(), gsi); err != nil {
		efd.Close()
		return nil, err
	}
	return &irqfd{vm: vm, efd: efd, gsi: gsi}, nil
}

// Trigger pulses the line: KVM raises and lowers it when the eventfd is
// signalled. It does not block.
func (i *irqfd) Trigger() error { return i.efd.Signal() }

// Close unbinds the eventfd from the line and closes it.
func (i *irqfd) Close() error {
	err := i.vm.DeassignIRQFD(i.efd.Fd(), i.gsi)
	if cerr := i.efd.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("closing irqfd of GSI %d: %w", i.gsi, err)
	}
	return nil
}

// ioeventfdNotifiers opens, per queue, an ioeventfd on the QueueNotify
// register at addr that matches the queue's index.
type ioeventfdNotifiers struct {
	vm   *kvm.VM
	addr uint64
}

var _ devices.Notifiers = ioeventfdNotifiers{}

// Notifier assigns queue q's ioeventfd.
func (n ioeventfdNotifiers) Notifier(q int) (devices.Notifier, error) {
	efd, err := kvm.NewEventFD()
	if err != nil {
		return nil, err
	}
	match := uint64(q)
	ev := kvm.IOEventFD{Addr: n.addr, Len: 4, Datamatch: &match, FD: efd.Fd()}
	if err := n.vm.AssignIOEventFD(ev); err != nil {
		efd.Close()
		return nil, fmt.Errorf("notifying virtio queue %d: %w", q, err)
	}
	return &ioeventfd{vm: n.vm, ev: ev, EventFD: efd}, nil
}

// ioeventfd is one queue's assigned ioeventfd and its eventfd, which the
// queue's worker reads.
type ioeventfd struct {
	// Immutable after Notifier.
	vm *kvm.VM
	ev kvm.IOEventFD
	*kvm.EventFD
}

// Close deassigns the ioeventfd, then closes the eventfd, which wakes the
// worker's Read.
func (e *ioeventfd) Close() error {
	err := e.vm.DeassignIOEventFD(e.ev)
	if cerr := e.EventFD.Close(); cerr != nil {
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return fmt.Errorf("closing ioeventfd at %#x: %w", e.ev.Addr, err)
	}
	return nil
}

// newLinuxVirtioMMIO returns the transport of dev in slot i of a Linux
// guest: its interrupt an irqfd on the slot's GSI, its queues served by
// their own goroutines woken through ioeventfds. The irqfd is appended to
// vm.irqfds, which Close closes.
func (vm *VM) newLinuxVirtioMMIO(i int, dev devices.VirtioDevice) (*devices.VirtioMMIO, error) {
	irq, err := newIRQFD(vm.kvm, VirtioSlotGSI(i))
	if err != nil {
		return nil, fmt.Errorf("wiring virtio slot %d's interrupt: %w", i, err)
	}
	vm.irqfds = append(vm.irqfds, irq)
	notifiers := ioeventfdNotifiers{vm: vm.kvm, addr: VirtioSlotAddr(i) + devices.QueueNotifyOffset}
	return devices.NewAsyncVirtioMMIO(vm.devCtx, dev, vm.mem, irq, notifiers), nil
}

// QuiesceVirtio quiesces every virtio transport of the VM
// (devices.VirtioMMIO.Quiesce): once it returns no request is in flight
// and none is processed until ResumeVirtio, so guest memory and the
// transports' State stand still. A live migration calls it after Pause
// (a paused vCPU cannot notify; one blocked in a synchronous notify would
// keep Pause waiting) and before its last memory pass. On failure (ctx
// ended) nothing stays quiesced.
func (vm *VM) QuiesceVirtio(ctx context.Context) error {
	ts := vm.virtioTransports()
	for i, t := range ts {
		if err := t.Quiesce(ctx); err != nil {
			for _, q := range ts[:i] {
				q.Resume()
			}
			return fmt.Errorf("quiescing virtio transport %d (disks first, then network cards): %w", i, err)
		}
	}
	return nil
}

// ResumeVirtio undoes QuiesceVirtio: the transports serve again, first
// what was notified meanwhile.
func (vm *VM) ResumeVirtio() {
	for _, t := range vm.virtioTransports() {
		t.Resume()
	}
}
