// Package engine is the upstairs' job engine: the pure decision core of a
// volume client replicating to three downstairs. It owns the job list
// (IDs, dependencies by overlap and kind), each replica's queue and
// backlog, quorum accounting (a write or flush completes at two replicas),
// read routing and retries, torn-write rewrites, backpressure, the replica
// state machine (replica_state.go), the rejoin and restart-reconciliation
// decisions (restart.go) and the routing of guest writes to a replica under
// live repair (live_repair.go).
//
// An Engine is plain data: no locks, goroutines, clock or IO. Each input
// (a submission, a reply, a connection event) is one method call; the
// decisions it makes pile up as Actions, which the driver takes with
// TakeActions after the call and carries out in order (wake a replica's
// sender, complete a caller, copy a write's data out of the caller's
// buffer, retire a job, report a state change). A driver serializes its
// calls. Two drivers use it: volume/upstairs, over QUIC sessions and
// goroutines, and the deterministic simulator volume/sim, under a
// scheduler it controls; both run this very code.
//
// Invariants (volume/upstairs/doc.go states the volume-level ones):
//   - Job IDs increase, and each replica is handed its jobs in ID order,
//     each with the earlier jobs still pending there that it must follow.
//   - A job's data is read from the caller's buffer only while the caller
//     waits; a write a replica still needs after its quorum is reached is
//     privatized (ActPrivatize) before the caller is released.
//   - An Offline replica's backlog is bounded (Limits); past it, while
//     another replica is Active, the replica is Faulted.
//   - Errors the engine decides wrap ErrNotActive, ErrNotEnoughReplicas,
//     ErrCorrupt or ErrRestarted; volume/upstairs hands them on by the same
//     values.
package engine
