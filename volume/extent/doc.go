// Package extent is the on-disk region of one downstairs replica: the
// extent files that hold a volume's blocks, each block's recorded hash,
// each extent's {generation, flush number, dirty} trailer, and the crash
// rules that keep a replica from ever serving wrong data silently.
//
// A Region is the live object (it owns the open files and a flock on the
// directory); a Spec is plain, validated data stored as region.json. The
// downstairs job engine drives a Region: it orders overlapping IO itself,
// calls Flush when the upstairs flushes, and uses the repair primitives
// (ExtentHashes, ReadExtentBlocks, RepairExtent) as source or destination
// of reconciliation and live repair.
//
// # Directory
//
//	region.json   {"uuid","block_size","extent_blocks","extent_count","format_version"}
//	fence.json    {"highest_gen"}: the highest activation generation accepted
//	000000.ext    extent 0
//	000001.ext    extent 1 ...
//
// region.json is written last at Create (temporary file, fsync, rename,
// fsync of the directory), so its presence means a complete region.
// fence.json is replaced the same way by SetHighestGen.
//
// # Extent file
//
//	[0, B*N)                 block data, N blocks of B bytes
//	[B*N, B*N+16*N)          metadata, 16 bytes per block, little endian:
//	                           hash u64  xxhash64 of the block as written
//	                           seq  u64  the extent's write counter at that write
//	                         all zero = never written (data reads as zeros and
//	                         the recorded hash is xxhash64 of a zero block)
//	[T, T+64), T 4 KiB-aligned  trailer, little endian:
//	                           magic "TERNEXT1", format u32, extent id u32,
//	                           gen u64, flush u64, seq u64, dirty u8, 7 zero
//	                           bytes, xxhash64 of the preceding 48 bytes,
//	                           8 zero bytes
//
// Files are created sparse at their full size, so creating a region writes
// only trailers. The write counter (seq) grows by one for every block
// written to the extent; the trailer keeps its value at the last trailer
// write and Open resumes from the larger of that and the largest seq in the
// metadata of a dirty extent. It lets a reader tell two writes of the same
// data apart; zero is reserved for "never written".
//
// # Crash rules
//
// The invariant: an extent whose trailer says clean holds, for every
// block, data that matches the recorded hash. A dirty extent may not, so
// Open checks it.
//
//  1. Before the first write to an extent after a flush (or after Open),
//     its trailer is rewritten with dirty=1 and fdatasync'd, before any
//     data is written.
//  2. A write is pwrite of the data, then pwrite of those blocks'
//     metadata entries; neither is synced. A write to blocks that span
//     extents is one such write per extent.
//  3. Flush, per extent written since the last flush: fdatasync (data and
//     metadata), then write the trailer {gen, flush, dirty=0}, then
//     fdatasync. Writers to the extent are excluded from the first
//     fdatasync until the trailer is durable, so nothing lands in between.
//     Extents not written since the last flush keep their numbers (as in
//     Crucible).
//  4. Open verifies every block of every extent whose trailer is dirty,
//     torn or garbled against its recorded hash. A mismatch (data without
//     its metadata, metadata without its data, a torn block) marks the
//     block corrupt: CorruptBlocks lists it, reads of it fail with
//     ErrCorruptBlock, and ExtentHashes reports it as differing from any
//     peer, until a write or a repair replaces it. A torn or garbled
//     trailer reads as Version{Dirty: true} with gen and flush 0.
//  5. An extent with corrupt blocks is never stamped clean: Flush syncs it
//     but leaves its dirty trailer and old numbers, so the next Open
//     re-verifies it (the marks are in memory only) and reconciliation
//     repairs it from a peer instead of copying from it.
//  6. A write that fails part way (ENOSPC, EIO) marks its blocks corrupt:
//     their content on disk is unknown. The extent is already durably
//     dirty, so the next Open decides block by block.
//  7. RepairExtent makes the trailer dirty first (rule 1), writes the
//     blocks, fdatasyncs, and only then writes the source's trailer and
//     fdatasyncs again. An interrupted repair leaves a dirty extent that
//     reconciliation repairs again.
//
// After a crash a block therefore reads back as its last flushed data, as
// any later write to it that fully reached disk with its metadata, or
// fails with ErrCorruptBlock; never as anything else. Close does not
// flush. A region opened with a dirty extent reports MayHaveLostWrites
// until its next Flush: writes acknowledged before the crash may be gone.
//
// # File system
//
// The region reaches its files through FS and File (file_system.go): the
// operating system's for Create and Open, any other for CreateOn and
// OpenOn, such as the simulated disk of package tern/volume/sim.
//
// # Concurrency
//
// A Region is safe for concurrent use. Reads and writes of different
// blocks run in parallel (pread/pwrite; writes share one lock per extent,
// reads take none); the caller orders overlapping IO, and IO to an extent
// against a RepairExtent of it. Flush waits for writes in flight to the
// extents it cleans and sees every write completed before it was called;
// writes arriving during a Flush wait for the extent they touch, reads do
// not wait. Close
// waits for every operation in flight. The steady-state read and write
// paths allocate nothing: metadata scratch comes from a per-Region pool.
//
// # Errors
//
// Callers branch with errors.Is on the sentinels (ErrOutOfRange,
// ErrUnaligned, ErrHashMismatch, ErrCorruptBlock, ErrNoRegion,
// ErrRegionExists, ErrReadOnly, ErrNoSpace, ErrClosed, ErrInvalidSpec,
// ErrBadRegion, ErrInUse, ErrStaleGeneration); per-block errors are a
// *BlockError naming the region-wide block.
package extent
