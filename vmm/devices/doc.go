// Package devices holds the VMM's device models: the 8250 UART at 0x3f8,
// the debug-exit port 0xf4, the boot-timer MMIO byte at 0xC0000000, and the
// virtio-mmio transport (virtio 1.x, modern layout) with a virtio-blk
// device over a pluggable block backend.
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
//   - Fields of rings shared with the guest (avail/used indexes and ring
//     entries) are read and written with sync/atomic through vmm/memory.
//
// The vCPU loop (vmm/vcpu) dispatches KVM_EXIT_IO and KVM_EXIT_MMIO to
// these handlers, and package vmm boots the test guests against them on
// KVM. Still to come: delivering Interrupt through an irqfd (and the
// UART's through IRQ 4 on the in-kernel irqchip), and moving queue
// processing off the vCPU thread onto an ioeventfd-driven goroutine. Here
// every device is also driven from Go tests exactly as a guest driver
// would.
package devices
