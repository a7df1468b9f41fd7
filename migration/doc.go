// Package migration moves a running VM from one tern VMM to another: live
// migration by pre-copy over QUIC with mutual TLS, or, on one host, by
// handing over the guest-memory memfds. It owns the protocol (wire.go,
// peer.go), the source and target engines (Send, Receive), the
// convergence rule (Decide), and the
// one Phase and one Progress type that the engines, the instance
// controller (instance, which drives the engines), the API, the client
// and `tern migrate` all publish and read.
//
// What it needs of a VM is in vmm's migration.go (a VM built on given
// memory, dirty logging, the vCPUs' KVM handles) and vm_state.go (the
// VM's state as entries of kind, version and bytes, each device encoding
// its own: devices.Stateful). This package carries those entries without
// reading them. The runner that drives a
// migration between two VMMs through their APIs is instance/runner; the
// black-box tests of `tern migrate` are migration/migratetest.
//
// # Protocol
//
// The target dials the source (volume/transport) and opens one stream.
// Every message is a frame: length uint32 (of what follows), type uint8,
// payload (wire.go); page data follows a pages frame raw, outside its
// length, so it is written straight into the target's guest mapping.
//
//  1. Hello: the target offers its protocol versions and what it asks of
//     this migration (Offer: migration id, downtime target, same host, its
//     API URL; a block versioned on its own), the source answers with the
//     highest version both speak, or an error (ErrNoCommonVersion) that
//     ends both sides cleanly.
//  2. sync: the source sends its preamble (the opaque instance spec, the
//     RAM layout, the vCPU count, the memory method); the target builds
//     its VM, paused and never yet run, and answers ready. Same-host, the
//     memfds pass first (memfd.go) and the target builds on them.
//  3. ram_push: rounds. The first sends every non-zero page; each later
//     one the pages KVM's dirty log (and the VMM's own bitmap) recorded
//     since the previous, less the zero pages never yet delivered (the
//     target's fresh memory holds those already). The target acknowledges each round; the source
//     measures bandwidth from round start to acknowledgement and stops
//     iterating per Decide (convergence.go): dirty bytes / bandwidth ≤
//     the downtime target, or the round limit.
//  4. pause: the source parks its vCPUs (the devices are driven by them)
//     and runs SourceConfig.AfterPause (the controller flushes its disks).
//  5. ram_push_dirty: the last dirty pages (same-host: nothing; the
//     memory is shared).
//  6. device: a list of {kind, version, payload}, opaque here
//     (vmm.VM.SaveState): vCPU state, clock, UART, serial history, boot
//     timer, each disk's and card's virtio-mmio transport, a Linux
//     guest's irqchips and PIT. The target's VM (vmm.VM.RestoreState)
//     checks every entry's kind and version and that they describe it
//     before it loads any; an unknown kind or version is an error that
//     aborts the migration (ErrUnknownDevice, devices.go).
//  7. finish: the target runs TargetConfig.BeforeFinish (the controller
//     activates its volumes at their higher generation) and says it is
//     ready; the source sends commit. The
//     source's decision to send commit is the one point of no return:
//     from then on it never resumes its guest; the target runs its guest
//     iff it read commit, then acknowledges (resumed; from protocol
//     version 2 with its own parts of the pause: restore and resume),
//     which ends downtime. The source publishes where the pause went
//     (apiv1.PauseBreakdown, pause_timer.go).
//
// # Invariants
//
//   - Guest memory is never staged: the source writes pages from its
//     mapping to the stream and the target reads them from the stream
//     into its mapping.
//   - The target's guest never executes an instruction before commit: its
//     vCPUs are created parked and are resumed only after commit.
//   - On any failure before commit the source, in this order, re-marks
//     every page it sent (and every page the dirty log still held) dirty
//     in the VMM's bitmap, turns dirty logging off, resumes its guest,
//     tells the peer (best effort: an error frame, then the connection
//     closed with the same code), and only then publishes phase error and
//     returns the error. The target, which never runs before commit,
//     stops and closes the VM it built and ends in phase error.
//   - Decide, the convergence rule, is a pure function over plain data.
//   - Every decoder of network bytes returns an error on malformed input,
//     never panics, and allocates at most in proportion to its input.
package migration
