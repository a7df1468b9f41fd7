// Package ec is tern's erasure-coded volume: client blocks striped over k
// data shards with m Reed-Solomon parity shards
// (github.com/klauspost/reedsolomon), each shard an ordinary region on
// its own downstairs, reached over the replicated volume's protocol
// (volume/wire) and transport (QUIC with mutual TLS, volume/transport).
// A region does not know it is a shard; the k+m regions share one UUID.
//
// # Layout
//
// A stripe is one block at the same offset on every shard: k data blocks
// and m parity blocks. Client block b is data shard b mod k's block
// b / k (Layout.Locate), so k consecutive aligned client blocks are one
// stripe, a sequential write encodes without reading, and a range of
// stripes is one contiguous range on every shard (one request per shard).
// The volume is k times one shard's region.
//
// # Structure
//
// The decisions are pure: Layout (mapping), Codec.Resolve (what a stripe
// should hold given the blocks read of it and which shards are suspect)
// and the stripe lock table (which IO may run). Volume is their driver:
// one owner goroutine per shard dials, activates and serves a session
// (shard_session.go; a reader goroutine per session matches replies to
// requests), and one repair goroutine per session rebuilds what the
// shard is behind on (repair.go).
//
// # Invariants
//
//  1. IO on overlapping stripes is ordered by stripeLocks in arrival
//     order: writes and repairs hold their stripes exclusively, reads
//     share them. Each shard's requests go out on one stream in the order
//     issued, and the downstairs runs overlapping ones in that order.
//  2. Every shard has a set of stripes it may be wrong on ("behind"): a
//     write marks its blocks behind on every shard it sends to before
//     sending and clears them as each shard acknowledges; a shard that
//     fails a write is dropped with its blocks still marked; a block that
//     fails its hash is marked; a shard that rejoins after a crash with
//     unflushed writes has its dirty extents marked, and one that joins
//     after the activation those a peer flushed after the last flush its
//     metadata names, and one that rejoins reporting pristine an extent
//     the volume knows it held data on (a region replaced by an empty one,
//     whose zeros fail no hash) has that extent marked. No read, write
//     count or reconstruction trusts a
//     behind block, except that a stripe with fewer than k trusted blocks
//     is trusted again once more than k hash-intact blocks of it agree.
//  7. The last block of each shard's region is its metadata (layout,
//     shard index, region, the last flush it took while current;
//     shard_meta.go), written ahead of each flush on every shard behind
//     on nothing. Activation reads it: a shard behind a peer's flush is a
//     suspect on the extents flushed since, and a shard of another
//     layout or index is refused (targets in the wrong order).
//  3. A write is acknowledged once every stripe it touches is held by
//     k+1 shards (the shards written that acknowledged it, plus the
//     untouched ones not behind on the stripe), or by every connected
//     shard when only k are connected; never by fewer than k. Below k it
//     waits (the caller's context bounds it) and is retried whole, the
//     stripe recomputed from the current trusted blocks. A flush likewise
//     counts k+1 acknowledgements (or every connected shard, at least k),
//     and is sent on each shard after every write acknowledged before it.
//  4. Reads go to the data shards; a block that is missing, slow
//     (Config.ReplyTimeout), refused or failing its hash is reconstructed
//     from any k trusted blocks of its stripe (ReconstructData), and a
//     hash-failing one is marked so the shard's repair rewrites it.
//  5. Repair is live and block-granular: for each behind stripe, under
//     its lock, the shard's block is reconstructed from k trusted others
//     and written only if the shard's data or recorded hash differs.
//     Progress is a reconcile.Tracker per repair pass (the replicated
//     volume's progress object).
//  6. Fencing is the downstairs': Activate(gen) on every shard fences
//     lower generations, and a Fenced reply stops all IO with ErrFenced.
//
// # Limits
//
// Writes are not replayed: a shard that misses one is rebuilt by
// reconstruction, so a shard back after a blip costs a read of k blocks
// per stripe it missed. The behind sets live in memory; across an
// upstairs restart, activation resolves every stripe of each extent a
// shard's metadata says it is behind on, or that is dirty
// (Codec.Resolve), so a torn
// partial-stripe write left by an upstairs crash is settled there: a
// single disagreeing block is blamed when m ≥ 2, otherwise the data
// blocks decide and parity is recomputed. When a data block is missing
// too (the RAID "write hole": a block torn or damaged as well), the stripe
// is settled once every shard has answered (Codec.Settle: the decoding
// that rebuilds the missing block to the hash its shard recorded);
// while a shard is still away it waits, and activation fails naming the
// stripe if its context ends first. Repair settles a stripe the same way
// when too few shards are trusted on it (every shard crashed at once).
// A downstairs stamps only the extents a
// flush covers, so shards of one stripe legitimately carry different
// extent versions: versions alone cannot tell a shard that missed
// writes, which is what the metadata block is for. A shard still owing
// a write when a flush starts is not recorded current by it (a clean
// Close flushes twice), so after a crash it may be re-read where it
// need not be. The client volume is k × (region blocks − 1) blocks.
// Data blocks are copied between the client
// buffer and per-shard buffers (the replicated volume's zero-copy path
// does not apply to interleaved stripes).
package ec
