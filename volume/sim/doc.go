// Package sim is a deterministic simulation of one volume: one upstairs
// (and, for a takeover, a second one), three downstairs and the network
// between them, driven by one seeded scheduler, in the manner of
// FoundationDB's simulator and TigerBeetle's VOPR.
//
// # What is real and what is simulated
//
// The decision cores are the project's own, not re-implementations:
//
//   - the upstairs job engine, through engine.Engine, including what
//     becomes of a rejoining session (Engine.SessionActivated: the flush
//     its extents show applied, replay or repair or hold), the live-repair
//     source (Engine.LiveRepairSource) and which held replicas are behind
//     (Engine.Behind);
//   - each downstairs session's admission rule (downstairs.Admit), what a
//     request touches (downstairs.AccessOf), its job ordering
//     (downstairs.JobOrder) and the fencing rule downstairs.MayActivate;
//   - the live-repair walk (reconcile.LiveRepair, LiveRepairNeeded,
//     DiffBlocks), the activation and restart planners
//     (reconcile.PlanActivation, PlanRestart) and the choices a repair
//     makes carrying a plan out: donors of an older intact copy
//     (reconcile.NewestFirst), which peers recorded a damaged block alike
//     (reconcile.RecordedAlike), and whether a clean source that served
//     bad data is mended, again if need be (reconcile.MendSourceAgain);
//   - the extent store (extent.Region) on a simulated disk (disk.go, an
//     extent.FS) that keeps only what was synced and, at a crash, keeps a
//     random prefix of the unsynced writes of each file and may tear the
//     last one.
//
// What is simulated is what is goroutines, sockets and clocks in
// production: the network (network.go: an ordered reliable stream per
// connection, as QUIC gives, over packets that may be reordered, delayed,
// dropped and retransmitted, or duplicated); the downstairs' session
// owner and workers (downstairs.go: it delivers requests, runs the jobs
// the real order releases on the real region, and replies); and the
// upstairs' event plumbing (upstairs.go, takeover.go, restart.go: dial,
// send jobs and repair calls in ID order, hand replies to the engine,
// and walk the repairs' steps as callbacks on the scheduler where
// replica_serve.go, live_repair.go, activation_reconcile.go and
// restart_reconcile.go block on calls). That plumbing asks the
// production functions above at every point where the drivers decide, so
// it holds no decision of its own to keep in step: the production
// drivers and the simulator call the same code. Running the production
// goroutines themselves would give up exact replay (the Go scheduler,
// not the seed, would order them), which is why the simulator runs its
// own plumbing around the shared decisions.
//
// The plumbing's steps are narrower than the drivers' in a few known
// ways: a takeover and a restart reconciliation wait for all three
// replicas (the real ones go ahead with two after
// Config.ActivationQuorumWait; here a crashed downstairs always
// restarts); a repair copies only the differing blocks, in one request
// (never Config.RepairWholeExtents, nor frames of several batches); and a
// dirty source's torn blocks are found by reading them one by one, where
// readIntact halves a refused batch.
//
// Each past fix the simulator found lives in that production code with a
// test-only switch (tern/volume/internal/fixes) that undoes it;
// TestRegressionSeeds undoes each in turn and requires its kept seeds,
// all below mutationSeedBound, to fail, and to pass with it in place.
//
// # A run
//
// Run(Config) creates three regions, activates the upstairs, then for
// Config.Steps ticks a workload submits writes (each block's content
// names its write), reads and flushes while faults are injected, each
// kind with its probability per opportunity (faults.go): per packet
// reorder, delay, drop, duplicate; per tick disconnect (with a partition
// of up to 300 ticks), crash and restart of a downstairs, a bit flip in a
// stored block, a takeover by a second upstairs at a higher generation,
// and the replacement of a replica by an empty one; and, off unless
// Config.Faults turns it on (TestSimulationWholeVolumeCrash does), a crash
// of all three downstairs at once, one of them losing power (a random
// prefix of its unsynced writes kept, the last maybe torn) and the others
// only their processes (damage to a block on two replicas at once would be
// two failures), never on top of an unrepaired bit flip; the upstairs then
// reconciles them with each other (restart reconciliation) and the read
// floors fall back to the durable writes. The fault model is
// one failure at a time: crashes, disconnects and replacements strike
// only while the other two replicas are Active (and not while a takeover
// reconciles), and a bit flip only while no other replica holds an
// unrepaired one. Then faults stop, partitions heal, crashed downstairs
// restart, and the run continues until every replica is Active with
// nothing in flight; a final flush follows.
//
// # Invariants
//
// Checked after every event, or at the end, against an oracle of what the
// callers were told (oracle.go):
//
//  1. No write acknowledged and covered by an acknowledged flush of its
//     upstairs is ever lost: at the end every replica holds it or a newer
//     write of the block.
//  2. A read returns, for each block, the newest write acknowledged before
//     the read was submitted or a newer one (in flight, failed or later),
//     and never data that no write produced (which fails its hash).
//  3. A fenced upstairs gets no write applied: a mutation applies only
//     from a session whose generation is the region's highest.
//  4. After faults stop and repair ends, the three replicas are
//     block-for-block identical (blocks a bit flip damaged and nothing
//     read or rewrote since are counted as latent, not compared).
//  5. Memory stays bounded: an upstairs never holds more than twice its
//     in-flight bound of jobs, and, while a replica is Active, an Offline
//     replica never owes more than its backlog bound (past it, it is
//     Faulted).
//
// The run stops at the first violation, and then counts the blocks it
// lost (Result.Lost: acknowledged, flushed data no replica holds); the
// final comparison counts every lost block, not the first. A run must
// also have made progress: writes and flushes acknowledged, the final
// flush included (a run that does nothing fails).
//
// # Determinism
//
// Every choice comes from the scheduler's PCG generator, seeded by
// Config.Seed; events at one tick run in the order they were scheduled;
// no map is iterated where order matters; nothing reads a clock. So a
// seed replays exactly: TestReplayIsExact runs seeds twice and compares
// the whole event trace, whose hash the summary line reports. The extent
// store runs a few goroutines of its own (parallel flushes and extent
// loads), each on its own files, so their interleaving cannot change the
// outcome.
//
// # The erasure-coded volume
//
// RunEC (ec_world.go) simulates the erasure-coded volume differently: it
// runs the production goroutines themselves, ec.Volume and k+m
// downstairs.Server on extent.Region over the simulated disk, with the
// production transport, quic-go and mutual TLS between them over a
// simulated datagram network (ec_network.go, a transport.Network that
// delays, reorders, drops and duplicates datagrams and partitions hosts),
// inside a testing/synctest bubble, so time is virtual and a run of 10
// simulated seconds takes about one. The fault kinds are this package's
// (faults.go) and the oracle is the replicated world's (oracle.go); the
// fault model and invariants, and what was found, are in
// docs/reliability.md. The price is exact replay: the Go scheduler orders
// the goroutines, so a seed fixes the faults and choices, not the
// interleaving.
//
// # Running it
//
//	go test ./volume/sim -run TestSimulation -v              # the CI budget (20 seeds)
//	go test ./volume/sim -run TestSimulation -v -seeds 500   # seeds 0..499
//	go test ./volume/sim -run TestSimulation -v -seed 42     # one seed, replayed exactly
//	go test ./volume/sim -run TestSimulationWholeVolumeCrash -v -seeds 500   # with crashes of the whole volume
//	go test ./volume/sim -run TestRegressionSeeds -v      # each past fix undone in production code
//	tern bench sim --seeds 10000                             # a campaign, outside CI
//	go test ./volume/sim -run 'TestSimulationEC$' -v -ec.seeds 200   # the EC volume's seeds
//
// Each seed logs `sim: seed=S events=N faults=F trace=H violations=V`. A
// failing seed is shrunk (Shrink: faults dropped by delta debugging, then
// the faulty phase halved, while it still fails) and its shortest failing
// run is printed with the command that replays it (-seed S -steps N -skip
// LIST) and its whole event trace.
package sim
