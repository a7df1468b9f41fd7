// Package downstairs is the replica server: it serves one region (package
// tern/volume/extent) to upstairs sessions over QUIC with mutual TLS
// (package tern/volume/transport), speaking the protocol of package
// tern/volume/wire.
//
// # Structure
//
// Each connection is a session with one owner goroutine (session.run)
// that holds all of the session's ordering state, a reader goroutine that
// decodes requests into jobs, and a writer goroutine that encodes
// replies. Jobs execute on the server's bounded worker pool. The decision
// of which jobs may run is made by engine, a pure core over plain data
// (engine.go), table- and random-tested apart from any IO.
//
// # Session, in order
//
//  1. Hello: the server picks the highest common protocol version and
//     checks the region UUID (zero accepts any), then answers HelloReply;
//     otherwise it sends a session-level Error and closes.
//  2. A read-write session sends Activate{Gen}. Gen must exceed the
//     highest generation the region has ever accepted; the server stores
//     it durably (extent.Region.SetHighestGen) before ActivateAck, makes
//     the session the active one and fences the previous active session.
//     The ActivateAck says whether the region may have lost writes
//     (extent.Region.MayHaveLostWrites: opened after a crash with dirty
//     extents, not flushed since), so a rejoining upstairs repairs the
//     replica rather than replaying its backlog over it.
//     Gen at or below the highest is refused with CodeGenTooLow.
//  3. Requests run in the job engine's order and each gets one reply
//     (Ack, ReadResponse, ExtentVersions, ExtentHashes, RepairData, Fenced
//     or Error) in completion order.
//
// # Invariants
//
//   - Ordering: a job runs only after every job it lists as a dependency
//     and every earlier conflicting job (overlapping blocks with a write on
//     either side; a flush against every write, flush and metadata read)
//     has completed. Writes are acknowledged once applied, flushes once
//     durable.
//   - Fencing: at most one session is active. Mutations (write, flush,
//     repair write) hold the fence's read lock from the active check to the
//     end of the region call, and a takeover holds its write lock, so every
//     mutation of a fenced session either completed before the takeover or
//     is never applied; it is answered with Fenced. The fenced session also
//     receives an unsolicited Fenced (JobID 0) and then Fenced for every
//     request. The generation survives restarts (fence.json).
//   - Read-only sessions (Hello.ReadOnly) never activate and never fence;
//     they may read blocks, region info, extent versions and extent hashes.
//     Repair reads and writes need the active session.
//   - A write whose data does not match its hashes is refused with
//     CodeHashMismatch and nothing of it is stored (extent verifies before
//     writing).
//   - Flush.Gen must be the session's activation generation.
//   - Memory is bounded: a session holds at most MaxJobsPerSession
//     requests between decode and reply; the reader stops reading (and QUIC
//     flow control stops the peer) when they are taken. Data buffers are
//     pooled in size classes; the steady state allocates none.
//   - Every goroutine is owned: the reader, writer and owner of a session
//     end before serveConn returns, sessions and workers before Serve
//     returns.
package downstairs
