// Package devices holds the VMM's device models: the 8250 UART at 0x3f8,
// the debug-exit port 0xf4, the boot-timer MMIO byte at 0xC0000000, and the
// virtio-mmio transport (virtio 1.x, modern layout) with a virtio-blk
// device over a pluggable block backend and a virtio-net device over a
// frame backend (a TAP, tern/vmm/tap).
//
// Invariants:
//   - A device is a model over plain Go state behind small interfaces:
//     port-IO and MMIO handlers take the access's address and bytes, and
//     anything that leaves the device (an interrupt, an exit status, serial
//     output) goes through an injected interface, a channel or a
//     subscription. No device blocks its caller on a consumer.
//   - Nothing a guest writes can crash the VMM: malformed virtqueues,
//     descriptors outside RAM, descriptor loops, wrong buffer directions and
//     short headers end in an IO-error status for that request (or the
//     device's NEEDS_RESET status when the queue itself is unusable).
//   - virtio-blk moves data in place: backend reads land directly in, and
//     writes come directly from, slices of guest memory (vmm/memory); only
//     requests not aligned to the backend's block size use a one-block
//     bounce buffer for read-modify-write.
//   - virtio-net offers MAC and STATUS only: no checksum or segmentation
//     offload, no mergeable receive buffers, no control queue. Its receive
//     side runs on the device's own goroutine (the backend, not the
//     driver, decides when a frame comes) and reaches its queue through
//     VirtioMMIO.Deliver, holding its queue as a request does; with no buffer
//     posted it holds the frame until the driver notifies the queue.
//     Close stops that goroutine; Pause stops its guest-memory writes.
//   - Fields of rings shared with the guest (avail/used indexes and ring
//     entries) are read and written with sync/atomic through vmm/memory.
//   - A virtio queue is processed by one goroutine at a time: the
//     notifying vCPU's on the synchronous path, or the queue's own worker
//     on the asynchronous one (NewAsyncVirtioMMIO: woken by a Notifier,
//     an ioeventfd for a Linux guest). Whoever processes queue q holds
//     its run token; a reset, a QueueReady 0 and Quiesce take the tokens,
//     so each waits for the request in flight and nothing touches the
//     rings after it. A worker starts when its queue is ready on a
//     DRIVER_OK device and is stopped (its Notifier closed) by a reset,
//     QueueReady 0, SetState and Close.
//   - The used-buffer bit of InterruptStatus is set before Interrupt is
//     triggered, and only the driver's InterruptACK clears it.
//   - Each device whose guest-visible state migrates (the UART, its
//     History, the boot timer, the virtio-mmio transport) is Stateful: it
//     encodes its state itself, in its *_state.go file, under a kind and
//     a version, and restores it from those bytes, refusing what it cannot
//     read with ErrUnknownState, ErrMalformedState or ErrStateMismatch.
//     Package vmm collects them with the vCPUs' and the clock's into the
//     VM's state; the migration carries it without knowing a device.
//
// The vCPU loop (vmm/vcpu) dispatches KVM_EXIT_IO and KVM_EXIT_MMIO to
// these handlers, and package vmm boots the guests against them on KVM:
// for a Linux guest with an irqfd as each virtio device's Interrupt and an
// ioeventfd per queue (vmm/virtio_irq.go). Here every device is also
// driven from Go tests exactly as a guest driver would.
package devices
