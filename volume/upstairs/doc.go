// Package upstairs is tern's volume client: it fans block IO out to the
// three downstairs replicas of a region over QUIC (mutual TLS), acknowledges
// writes and flushes once two replicas have them, serves reads from one
// replica with every block verified, and keeps replicas consistent through
// disconnects, replay, faults and fencing.
//
// # Structure
//
// The decisions live in a pure core, the job engine (package
// volume/upstairs/engine): plain data with no locks, goroutines, clock or
// IO, driven by method calls (submit a job, a reply arrived, a connection
// came or went) that leave a list of actions (wake a replica's sender,
// complete a caller, copy a write's data, retire a job). This package is
// its driver and does the IO around it: activation (activation.go), the
// actions applied after each engine call (actions.go), status
// (status.go), IO (io.go), and one session per replica (replica.go:
// set-up in replica_setup.go, serving in replica_serve.go and
// replica_replies.go). Callers' goroutines
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
//     into a private buffer and rehashed, and no replica starts sending
//     the write during that copy; the caller's buffer, and the hashes
//     computed into its waiter (pooled, reused by its next IO), are never
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
//     write over a newer one. Past the bound (while another replica is Active)
//     the replica is Faulted and gets
//     no IO until live repair brings it back. Twice the bound may be live before callers
//     block (backpressure), so memory stays bounded.
//  6. A write or flush fails only when fewer than two replicas can take it
//     (a replica under repair, or back from one and not yet flushed,
//     counts: the repair brings what it skipped). A Fenced reply stops
//     all IO with ErrFenced.
//  7. Close first deactivates (flush, then wait until every connected
//     replica answered everything it was sent, bounded by
//     Config.DeactivateTimeout), then leaves no goroutine, connection or
//     buffer behind.
//  8. A replica that may have lost writes it acknowledged (its downstairs
//     restarted with unflushed writes: ActivateAck.LostWrites) is never
//     replayed as if its store were intact: it is live-repaired from an
//     Active peer, or, when none is Active (every replica restarted), the
//     rejoining replicas are held and reconciled with each other as at
//     activation, and every live job is replayed to them, before IO
//     resumes (restart_reconcile.go). IO issued meanwhile waits.
//
// # Limits
//
// Jobs are retired once every replica answered them, not kept until a flush
// covers them, so a replay cannot restore writes a downstairs lost in a
// crash: a downstairs that may have lost some (its region opened with
// dirty extents, not flushed since) says so in its ActivateAck, and a
// rejoining replica that does is repaired instead of replayed (invariant
// 8). After every replica restarted, an acknowledged write that was not
// flushed survives if some replica still owed it (it is replayed) or the
// replica the reconciliation took its extent from kept it; one every
// replica acknowledged and that source lost is gone, as at an activation.
// An Offline replica overflows its backlog only while another is Active:
// with none, faulting it would free nothing, and backpressure bounds the
// jobs instead. A rejoining replica is not replayed what its extent versions
// show flushed (Engine.FlushedOn): a replay cut short must not leave it
// older than its own flushed state. Replay needs the downstairs to
// accept an Activate from the same upstairs at the generation it already
// holds. Live repair copies from the lowest-numbered Active replica, one
// extent and one destination at a time; an attempt that fails on the
// source's data (a block it refuses as corrupt, or one whose data does not
// match its recorded hash) aborts, and the next copies from another Active
// replica when there is one.
//
// # Repair
//
// Activation reconciliation (activation_reconcile.go) runs after the
// sessions are activated and before guest IO starts: it plans with
// reconcile.PlanActivation over the extent versions the present replicas
// reported, and for each extent stamps a dirty source, compares block
// hashes with each destination and copies only the blocks that differ
// (every block with Config.RepairWholeExtents), then stamps the
// destination. A torn (corrupt) block is never copied: a source that
// stays dirty after its stamp holds corrupt blocks, which are taken
// from the other replicas (the plan's Donors, greatest version first,
// the first with an intact copy) and written to the source before the
// destinations are compared with it (repair_corrupt.go); a block no
// replica holds intact fails Activate with a *CorruptBlockError naming
// the extent and block. A clean source whose data a destination refuses
// as not matching the hashes it recorded (a bit flipped at rest, unseen
// in a clean extent) has those blocks rewritten from a replica that
// recorded the same hash, or failing that any intact copy
// (mendCleanSource), and the copy is retried. The upstairs reads from the source and writes to the
// destinations over their sessions (repair_copy.go, reads and writes
// pipelined); replicas never talk to each other. A destination is stamped
// only once its blocks are durable, so an interruption leaves every
// extent untouched or repaired, and Activate fails; a later activation
// (higher generation) finishes.
//
// Live repair (live_repair.go; the engine routes writes, its
// live_repair.go) brings back a
// replica that missed activation, was faulted, or was replaced
// (ReplaceReplica): while the volume runs, a Faulted replica keeps
// dialling with backoff, and a session serving the right region moves it
// to Repairing and starts one repair goroutine. It walks extents with
// reconcile.LiveRepair while guest IO continues: writes to repaired
// extents reach the replica, writes to the extent under repair are held
// in its queue until that extent is copied, later extents are skipped
// (the copy brings them); it serves no reads and gets no flushes until
// it is Active again. Jobs it missed while Faulted or Repairing count it
// once it is Active and has made a later flush durable (the copy holds
// their data), so they do not wait for a peer that died meanwhile. A
// source that refuses a block as corrupt aborts
// the attempt with a *CorruptBlockError (an Active replica should hold
// none; a guest write to the block replaces it). Repair requests are
// calls on the sessions (replica_call.go): sent in ID order with the engine's jobs, so a call
// on a source follows every write submitted before it. An abort leaves
// the replica Faulted; its next session retries from extent 0.
//
// # Distrust of the downstairs
//
// A replica is held to what it was sent (checkReply in replica_replies.go,
// pure and fuzzed with the decoder by FuzzReplicaReplies): every reply
// must answer exactly one outstanding job or call of its session, with the
// right type and size, or the replica is faulted with ErrProtocol and its
// FaultReason (in Status) says what it did, until it is Active again,
// while LastError follows its reconnect attempts; a read whose data had already landed in the
// caller's buffer is settled as failed first, so a peer overwrites it.
// Data that does not match its hashes is treated as corruption (served
// from a peer, the block rewritten), not as a protocol error. A replica
// that stops answering is dropped once its oldest owed reply is older than
// Config.ReplyTimeout (default 10 s): its reads move to a peer and its
// writes wait in the Offline backlog. One that sends nothing at all, not
// even the acknowledgement of a keepalive (killed, hung, cut off), is
// dropped sooner, after Config.IdleTimeout (default 4 s) without a
// packet. A region geometry that fails
// extent.Spec.Validate is refused before anything is sized by it.
//
// Progress is published through reconcile.Tracker: one for the
// activation (from New on), one per live-repair attempt; RepairStats and
// the tern_upstairs_repair_* metrics count the work.
package upstairs
