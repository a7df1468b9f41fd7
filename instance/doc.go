// Package instance holds the two pure decision cores of an instance's
// lifecycle (DESIGN §5): the request policy, which says whether a request
// is enqueued, ignored or denied in a given state, and the state publisher,
// which numbers and hands out the states an instance goes through. Neither
// touches KVM, sockets, files or timers; the VM controller that drives them
// is a thin layer around them.
//
// Request policy (request_policy.go). Decide(state, pending, request)
// returns a Decision and the new Pending set, and is the only place that
// decides legality. Invariants, each tested over every input:
//   - Only an Enqueue changes Pending, by adding exactly the request, and
//     never one that is already pending. A Deny or Ignore returns Pending
//     unchanged, so a refused request never leaves a flag behind.
//   - A migration in progress is part of Pending (MigrateOut on the source,
//     MigrateIn on the target), not a side flag. Only Pending.Completed
//     removes a request; the controller calls it exactly once for every
//     enqueued request when it ends, succeeded, failed or dropped, so a
//     failed migration handshake leaves nothing pending.
//   - Reboot, migrate_out and migrate_in are denied while creating or
//     starting; run and stop are accepted, and stop aborts creation.
//   - Nothing is enqueued while stopping, stopped, destroyed or failed, and
//     nothing behind a pending stop; stop itself is never denied.
//   - Every Deny carries a Reason; Decision.Err turns it into a
//     *WrongStateError matching ErrWrongState, which the API answers with
//     409 {"error_code":"wrong_state","message","state"}.
//
// State publisher (publisher.go). A Publisher holds the latest apiv1.View
// {gen, state, migration:{in, out}}. Invariants:
//   - The first view has gen 1 and each Publish adds exactly 1, also
//     under concurrent publishers; everything one Publish changes appears in
//     one view (a failed migration's out.phase=error together with
//     state=running, seed 001).
//   - Views are plain values: a published view never changes.
//   - WaitAfter(ctx, N) returns the latest view as soon as gen > N,
//     blocking on a channel that every publish closes and replaces; no
//     polling. Once Close is called, a waiter with nothing newer gets
//     ErrGone (the API's 410); a waiter that is behind still gets the final
//     view first.
//
// Operating contract for the controller (one owner goroutine per instance):
//  1. The API handler, under the instance lock, calls Decide with the
//     current state and Pending, stores the returned Pending, and on Enqueue
//     hands the request to the owner goroutine; on Deny it returns
//     Decision.Err.
//  2. The owner goroutine carries out requests (a stop first, pre-empting a
//     pending run or an activation in progress), publishes each state change
//     with one Publish, and calls Pending.Completed for every request it
//     finishes or drops, in one place after the request's handler returns.
//  3. When the instance starts halting it completes every pending request
//     except the stop it is carrying out; Consistent(state, pending) holds
//     after every step, which the controller's tests assert.
//  4. After publishing destroyed it calls Close.
//
// The controller (controller.go, controller_run.go). Start(cfg) returns
// at once with the instance at gen 1 (or FirstGen), creating; its owner
// goroutine then
//  1. opens each disk (a file, or a volume's upstairs) and starts each
//     volume's Activate on a goroutine of its own, in the background;
//  2. builds the VM through the Machine interface (machine.go: the one
//     place that knows package vmm's API) over every disk, one
//     virtio-blk device each in spec order, booting the ELF or Linux
//     guest the spec names;
//  3. on run, publishes starting, waits for every activation to end, then
//     starts the vCPUs and publishes running;
//  4. on reboot, publishes rebooting, replaces the VM with a fresh one over
//     the same disks, and publishes running;
//  5. on stop (at any point, activation included), publishes stopping,
//     cancels activation, stops and closes the VM, closes every upstairs
//     (its QUIC connections) and file, and only then publishes stopped and
//     destroyed and closes the publisher. A failed build, activation or
//     vCPU ends the same way in failed.
//
// Migration (migration.go; the engines and the Progress it publishes are
// package migration's). A migration target is born migrating with
// migrate_in pending; its owner goroutine dials the source, builds from
// the spec the source sends merged with the ensure's disks and
// components (mergeMigrated: volumes at a higher generation, activated
// just before commit), and publishes running with migration.in at
// finish, or failed with it at error. On a source, AcceptMigration asks
// the policy for migrate_out and hands the connection to the owner
// goroutine, which runs migration.Send: migrating with migration.out while
// it runs; after success it halts to destroyed; after a failure it
// publishes running with out.phase error in one generation, completing
// migrate_out in the same step, so the next one is accepted from then.
//
// Done is closed when the owner goroutine has ended: nothing the instance
// built survives it. The console history (console.go) belongs to the
// controller, not the VM, so its offsets keep growing across reboots and
// it stays readable after the instance is gone. Spec (spec.go,
// spec_validate.go) is the validated description an instance is built
// from: DecodeSpec rejects unknown fields, and Validate reports every
// problem at once without opening anything.
package instance
