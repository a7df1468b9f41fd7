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
//     kernel's layout; abi_test.go asserts every size and offset, and
//     abi_state_test.go those of abi_state.go (FPU, MSREntry, XCR,
//     LAPICState, VCPUEvents, ClockData, the irqfd, ioeventfd, dirty-log
//     and dirty-ring structs).
//   - A VCPU is used from one goroutine, locked to its OS thread
//     (runtime.LockOSThread) for as long as it runs: KVM ties a vCPU to the
//     thread that runs it, and Go's runtime would otherwise move the
//     goroutine between threads.
//   - Run retries KVM_RUN on EINTR: Go preempts threads with signals
//     (SIGURG), which interrupt KVM_RUN without any exit to handle; and on
//     EAGAIN, which an application processor's KVM_RUN returns when the
//     guest's start-up IPI woke it.
//   - A kick is kvm_run's immediate_exit byte (SetImmediateExit, changed
//     atomically from any thread) plus a signal to the vCPU's thread: Run
//     reports KVM_RUN's EINTR as ExitIntr only while that byte is set.
//   - A missing capability or API version is ErrNotSupported (test with
//     errors.Is), so callers can skip cleanly on hosts that lack it; a
//     missing capability is a *CapabilityError that names it.
//   - VCPUState (vcpu_state.go) is a vCPU's whole architectural state as
//     plain data. SaveState first completes the last exit's IO
//     (CompletePendingIO): until the next KVM_RUN, KVM's registers show an
//     OUT or IN not yet done. RestoreState sets the pieces in the order
//     KVM checks them (CPUID first, events and MP state last; see its
//     doc). Its binary encoding is versioned and its decoder never panics.
//   - Dirty pages are logged per slot (MemLogDirtyPages) either in a bitmap
//     (GetDirtyLog, with manual protect ClearDirtyLog) or, when enabled
//     before any vCPU exists, in a ring per vCPU (EnableDirtyRing,
//     MapDirtyRing, ResetDirtyRings); a VM has one or the other.
//   - An EventFD (eventfd.go) is the one eventfd wrapper: non-blocking,
//     close-on-exec, read through Go's poller, so a goroutine waiting in
//     Read costs no thread and Close wakes it. AssignIRQFD and
//     AssignIOEventFD take its Fd; the caller keeps owning it and
//     deassigns before closing.
//
// Probe is the one definition of "/dev/kvm is usable" that both
// `kvmhost check` and the test helper kvm/kvmtest use: open it, create a
// VM, and run one vCPU in real mode to HLT. A node that opens but answers
// no ioctl is not usable. PVM says whether that /dev/kvm is kvm-pvm's,
// which is usable but cannot boot a stock Linux kernel (pvm.go).
package kvm
