// Package upstairs is tern's volume client: it fans block IO out to the
// three downstairs replicas of a region over QUIC (mutual TLS), acknowledges
// writes and flushes once two replicas have them, serves reads from one
// replica with every block verified, and keeps replicas consistent through
// disconnects, replay, faults and fencing.
//
// # Structure
//
// The decisions live in a pure core, the engine (engine.go,
// engine_events.go, replica_state.go): plain data with no locks, goroutines,
// clock or IO, driven by method calls (submit a job, a reply arrived, a
// connection came or went) that leave a list of actions (wake a replica's
// sender, complete a caller, copy a write's data, retire a job). The driver
// (upstairs.go, io.go, replica.go) does the IO around it: callers' goroutines
// submit and wait; one owner goroutine per downstairs dials, negotiates,
// activates, sends and replays, with one helper decoding replies; Upstairs.mu
// serializes every engine call, and actions are applied right after it.
//
// # Invariants
//
//  1. Job IDs increase; each replica is sent its jobs in ID order on one
//     ordered stream, each listing the earlier jobs it must follow there:
//     flushes follow everything, writes follow overlapping reads and
//     writes, reads follow overlapping writes. So a read never returns data
//     older than a write already acknowledged.
//  2. A write is acknowledged when two replicas applied it, and only once no
//     replica is reading the caller's buffer. If a replica still needs the
//     data (lagging, or Offline with a backlog), the data is first copied
//     into a private buffer and rehashed; the caller's buffer is never
//     touched after the call returns.
//  3. Replicas never diverge because a caller changed a buffer in flight: a
//     hash-mismatch rejection, or a private copy whose hashes differ from
//     those sent, marks the write torn, and a rewrite from the copy goes to
//     every replica, ordered after everything before it.
//  4. A read's data lands in the caller's buffer only while the caller
//     waits; a caller that gives up is released once no decode into its
//     buffer is running, and later replies are discarded.
//  5. An Offline replica keeps a bounded backlog (Config.BacklogJobs,
//     BacklogBytes) replayed in ID order when it reconnects; an ack of a job
//     implies its dependencies were applied, so a replay never runs an old
//     write over a newer one. Past the bound the replica is Faulted and gets
//     no IO until repaired. Twice the bound may be live before callers
//     block (backpressure), so memory stays bounded.
//  6. A write or flush fails only when fewer than two replicas can take it.
//     A Fenced reply stops all IO with ErrFenced.
//  7. Close first deactivates (flush, then wait until every connected
//     replica answered everything it was sent, bounded by
//     Config.DeactivateTimeout), then leaves no goroutine, connection or
//     buffer behind.
//
// # Limits
//
// Jobs are retired once every replica answered them, not kept until a flush
// covers them. A downstairs that loses acknowledged but unflushed writes
// (a host crash, not a process restart) therefore comes back with dirty
// extents that only reconciliation repairs. Replay needs the downstairs to
// accept an Activate from the same upstairs at the generation it already
// holds.
//
// # Seams for repair
//
// A replica that missed activation or faulted stays Faulted: its goroutine
// parks without a connection and the engine queues it nothing. The repair
// engine (same package) works through three seams:
//
//   - engine.repairStarted(r) (under Upstairs.mu, then stepLocked and
//     finishLocked) moves a Faulted replica to Repairing; its goroutine
//     connects and activates a session that carries calls but no guest IO.
//   - Upstairs.callReplica(ctx, r, req, buf) sends a repair request
//     (ExtentHashesRequest, RepairRead, RepairWrite, ExtentVersionsRequest,
//     Flush) on replica r's session, in session order, and returns the
//     reply; RepairData lands in buf. Every replica that serves, Active or
//     Repairing, accepts calls.
//   - engine.repairDone(r) makes it Active: guest IO flows to it again.
//
// During activation the sessions serve calls as soon as they are
// activated, before Activate starts guest IO: reconcileActivation
// (activation_reconcile.go) runs there with what each replica reported,
// and is where activation repair plugs in.
package upstairs
