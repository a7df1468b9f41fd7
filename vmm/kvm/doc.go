// Package kvm is tern's only door to the kernel's KVM API: typed wrappers
// over the raw /dev/kvm ioctls, made with golang.org/x/sys/unix (no cgo).
//
// Each wrapper owns what it opened: a System owns the /dev/kvm fd, a VM its
// VM fd, a VCPU its vCPU fd and the mmap'd kvm_run page. Close frees all of
// it and is safe to call twice; a VM's Close closes its vCPUs first.
//
// Invariants:
//   - The structs passed to ioctls (Regs, Sregs, Segment, DTable,
//     CPUIDEntry2, the kvm_run header and its IO exit) have exactly the
//     kernel's layout; abi_test.go asserts every size and offset.
//   - A VCPU is used from one goroutine, locked to its OS thread
//     (runtime.LockOSThread) for as long as it runs: KVM ties a vCPU to the
//     thread that runs it, and Go's runtime would otherwise move the
//     goroutine between threads.
//   - Run retries KVM_RUN on EINTR: Go preempts threads with signals
//     (SIGURG), which interrupt KVM_RUN without any exit to handle.
//   - A kick is kvm_run's immediate_exit byte (SetImmediateExit, changed
//     atomically from any thread) plus a signal to the vCPU's thread: Run
//     reports KVM_RUN's EINTR as ExitIntr only while that byte is set.
//   - A missing capability or API version is ErrNotSupported (test with
//     errors.Is), so callers can skip cleanly on hosts that lack it.
//
// Probe is the one definition of "/dev/kvm is usable" that both
// `kvmhost check` and the test helper kvm/kvmtest use: open it, create a
// VM, and run one vCPU in real mode to HLT. A node that opens but answers
// no ioctl is not usable.
package kvm
