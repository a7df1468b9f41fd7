// Package reconcile holds the decision cores of volume repair — which
// extents and blocks activation must copy, when activation may proceed on
// two replicas, how a replica under live repair is walked and how guest IO
// reaches it — and the Tracker that publishes repair progress.
//
// The cores (PlanActivation, DiffBlocks, DecideQuorum, LiveRepair) are
// plain functions and values over plain data, in the manner of etcd-raft:
// no locks, no goroutines, no clocks, no IO. Time arrives as a value, and
// the upstairs' owner goroutine (the driver) does every send, copy and
// flush. Only Tracker is shared between goroutines; it is safe for
// concurrent use and never blocks its writer on a reader.
//
// # Activation repair
//
// The driver runs, per activation at generation G:
//
//  1. Negotiate with the replicas, recording when each answered; call
//     DecideQuorum on every answer and at its RecheckAt. Proceed when it
//     says so; its Missing replicas go to live repair later.
//  2. Collect every present replica's extent versions and call
//     PlanActivation(G, ...). The session's flushes start at
//     Plan.NextFlush.
//  3. For each ExtentRepair, in order:
//     a. If SourceNeedsStamp (the source is dirty), flush the source
//     extent, stamping it with Target. The source is now the only
//     replica at the greatest version, and its blocks are durable. If it
//     still holds corrupt (torn) blocks — the extent layer then keeps it
//     dirty — take each from the first of Donors whose copy is intact
//     and write it to the source; a block no donor holds intact fails
//     the extent.
//     b. For each destination: take the source's and the destination's
//     per-block hashes of the data as it stands (a dirty destination's
//     recomputed or verified against its data, so a torn block shows as
//     different), DiffBlocks them, copy the differing blocks (Runs
//     groups them), then flush the destination stamping it with Target —
//     with an explicit version write if nothing was copied, since a
//     clean extent is not stamped by a flush.
//  4. Activate. Any failure aborts the activation; extents already repaired
//     stay repaired, and renegotiation plans again from fresh versions.
//
// A crash at any point converges on the next activation: until its stamp
// a destination is dirty (the extent's crash rule) or carries a lower
// version than the source, so it is planned again.
//
// # The repaired version
//
// Every replica relies on one rule: two clean copies of an extent with
// equal versions hold equal blocks. A repair must never break it, not
// even across a crash or on the replica that was absent.
//
// A clean source keeps its version, and destinations take it: a clean
// copy elsewhere with that version already holds the same blocks.
//
// A dirty source cannot simply be marked clean with its own numbers
// {g, f}: another replica — a destination not yet copied when the driver
// crashes, or the replica absent from a 2-of-3 activation — may hold a
// clean {g, f} copy without the source's unflushed writes, and would then
// look equal forever. So a dirty source's Target is {G, Plan.MaxFlush}:
// G is new to every replica (fencing makes activation generations
// unique), and the session's own flushes start above MaxFlush, so no other
// copy can ever carry that version with other blocks.
//
// # Live repair
//
// LiveRepair walks extents 0 to n-1, one at a time, while guest IO
// continues. For the extent Next returns, the driver reads it on the
// source ordered after every write to it already submitted (tern's
// upstairs sends the repair requests in job order on the source's
// session; Crucible flushes and closes the extent); compares versions
// (LiveRepairNeeded) and block hashes; copies; and calls Done. Guest writes are routed per extent by RouteWrite:
// repaired extents are kept current, the extent under repair receives
// writes ordered after its repair, later extents are skipped because the
// copy brings their data. The target never serves reads until the repair
// is complete. On failure Abort leaves the replica faulted; Retry starts
// again at extent 0.
//
// # Progress
//
// One Tracker per run (an activation, or one live-repair attempt). The
// activation driver moves it through PhaseNegotiating, PhaseComparing
// (collecting versions, planning) and PhaseRepairing (per extent: compare
// hashes, copy); a live repair sets PhaseLiveRepair at once. Totals grow
// as work is discovered — GrowTotals(len(plan.Extents), 0) after
// planning, then the differing bytes of each extent as DiffBlocks finds
// them — and Finish or Fail ends the run. Pull with Status, push with
// Subscribe; the final value is always delivered (unlike Crucible #1319).
//
// # Invariants
//
//   - A plan lists each extent at most once, in increasing order; its
//     source is never one of its destinations.
//   - After a repair every present replica of the extent holds the same
//     blocks and the version Target, which is clean.
//   - During live repair the done set is exactly the extents below the one
//     under repair; a write is never both skipped and already repaired.
//   - Within one Tracker run, counters never decrease, done never exceeds
//     total, phases only move forward, and the final value (PhaseDone or
//     PhaseError) reaches every subscriber.
package reconcile
