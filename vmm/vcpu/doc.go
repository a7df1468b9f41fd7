// Package vcpu runs virtual CPUs: one goroutine per vCPU, locked to its OS
// thread, that enters the guest with KVM_RUN and dispatches each exit to
// the port-IO or MMIO bus of vmm/devices handlers.
//
// Invariants:
//   - A vCPU's goroutine calls runtime.LockOSThread before its first
//     ioctl and never unlocks: the KVM API documentation says "vcpu
//     ioctls should be issued from the same thread that was used to
//     create the vcpu" (Documentation/virt/kvm/api.rst, "General
//     description"), and KVM binds the vCPU's state to the task that runs
//     it. The thread exits with the goroutine, so it never carries the
//     vCPU's signal pending or its state into other goroutines.
//   - KVM_RUN returning EINTR is normal (Go's runtime preempts with
//     SIGURG) and is retried inside kvm.VCPU.Run, never reported.
//   - Pause, Resume and Stop are requests under one mutex. A request sets
//     kvm_run's immediate_exit byte and then sends SIGURG to the vCPU's
//     thread (tgkill): a vCPU inside KVM_RUN leaves it with EINTR, and one
//     about to enter it returns at once because of the byte. There is no
//     polling: the goroutine waits for a resume on a condition variable.
//   - SIGURG is the kick because Go's runtime already sends it to
//     arbitrary threads for asynchronous preemption: its handler is
//     installed in every Go program, tolerates spurious deliveries (it
//     only preempts when the scheduler asked), and needs no signal.Notify
//     channel or handler of ours. A dedicated signal would need a handler
//     installed process-wide (signal.Notify) and a goroutine to drain it.
//     Programs that signal.Notify(SIGURG) themselves see these kicks, as
//     they already see the runtime's.
//   - Before it parks for a pause, a vCPU completes the instruction of its
//     last IO or MMIO exit by entering KVM_RUN once with immediate_exit set,
//     as the KVM API asks before state is saved; so a paused vCPU's
//     *kvm.VCPU (KVM) is at an instruction boundary and may be inspected
//     or captured from another goroutine until Resume.
//   - The buses are filled before the vCPUs start; registering a range that
//     overlaps another is an error. An access no device claims reads as all
//     ones (ports) or zeros (MMIO) and writes are dropped, as on a PC.
//   - A vCPU goroutine ends on Stop or on an exit the VMM cannot continue
//     from: KVM_EXIT_SHUTDOWN (a triple fault: ErrShutdown), an internal
//     error, an entry failure, or an unexpected exit. Wait returns why.
package vcpu
