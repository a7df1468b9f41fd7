// Package memory is a guest's RAM: one memfd per region, mapped MAP_SHARED
// into tern, so that KVM (which will map the same pages), the devices and
// migration all see one copy.
//
// Invariants:
//   - A Memory owns its regions; each Region owns its memfd and mapping,
//     and Close unmaps and closes both. New builds under a deferred cleanup
//     and hands ownership out only on success.
//   - Regions are page-aligned, non-empty and never overlap; New validates
//     every spec up front and reports every problem at once, naming both
//     regions of an overlap.
//   - Every access is bounds-checked and returns an error for a range that
//     is not wholly inside one region; no guest-controlled address can make
//     this package panic.
//   - Accessors return slices of the mapping itself (zero copy), capped so
//     that append cannot reach past the requested range.
//   - Memory shared with a running guest (virtqueues) is read and written
//     through the Atomic accessors, which use sync/atomic on the enclosing
//     aligned 32-bit word.
//   - Writes made by the VMM itself are invisible to KVM's dirty log, so a
//     device marks the pages it wrote with MarkDirty after the write; the
//     per-region DirtyBitmap merges KVM's bitmaps (MergeKVM) with those
//     marks, and Take harvests and clears them atomically.
//
// Package vmm registers each region as a KVM memory slot
// (KVM_SET_USER_MEMORY_REGION with the region's Bytes). Still to come:
// feeding KVM_GET_DIRTY_LOG into DirtyBitmap.MergeKVM, exercised here only
// with synthetic bitmaps.
package memory
