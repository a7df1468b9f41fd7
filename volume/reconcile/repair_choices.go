package reconcile

import (
	"slices"

	"tern/volume/ids"
	"tern/volume/internal/fixes"
)

// The choices an activation or restart repair makes while it carries a
// plan out, beyond the plan itself. The upstairs' drivers and the
// simulator (volume/sim) both call these, so a change to one is a change
// to what the simulator tests.

// NewestFirst returns the replicas in present other than src, the greatest
// version of extent e first and the lowest ReplicaID among equals: the
// best donors of an older intact copy of a block whose only copy on src
// is damaged (its newest write was not acknowledged by two replicas, so
// any intact copy is as good an outcome, and the newest loses least).
func NewestFirst(present []ReplicaVersions, e ids.ExtentID, src ReplicaID) []ReplicaID {
	byID := slices.Clone(present)
	slices.SortFunc(byID, func(a, b ReplicaVersions) int { return int(a.Replica) - int(b.Replica) })
	out := make([]ReplicaID, 0, len(byID))
	version := map[ReplicaID]Version{}
	for _, p := range byID {
		if p.Replica == src || int(e) >= len(p.Extents) {
			continue
		}
		out = append(out, p.Replica)
		version[p.Replica] = p.Extents[e]
	}
	if fixes.Undone(fixes.NewestDonorFirst) {
		return out
	}
	slices.SortStableFunc(out, func(a, b ReplicaID) int { return version[b].Compare(version[a]) })
	return out
}

// MaxSourceMends bounds how many times a repair mends one clean source
// for one destination: a disk that keeps damaging blocks faster than they
// are mended fails the repair rather than holding it forever.
const MaxSourceMends = 4

// MendSourceAgain decides whether a repair whose copy of an extent to a
// destination failed because the source served data that does not match
// the hashes the source recorded for it (a bit flipped at rest, which a
// clean extent's version does not show) mends the source's damaged blocks
// from its peers and copies again. Only a clean source is mended this way
// (a dirty one was read block by block when its corrupt blocks were
// mended). mends is how many times the source was mended for this
// destination so far; lastMended, once mends > 0, whether the latest mend
// found a damaged block: a block can be damaged again after its mend (a
// second flip), so the source is mended again, up to MaxSourceMends
// times, while the latest mend found something to mend (one that found
// nothing cannot make the next copy succeed).
func MendSourceAgain(sourceClean bool, mends int, lastMended bool) bool {
	switch {
	case !sourceClean || fixes.Undone(fixes.MendCleanSource):
		return false
	case mends == 0:
		return true
	case fixes.Undone(fixes.MendSourceTwice):
		return false
	}
	return lastMended && mends < MaxSourceMends
}

// RecordedAlike splits need, blocks of an extent whose copy on a clean
// source is damaged, by whether a peer recorded the same hash for them as
// the source (srcHashes, peerHashes: each replica's recorded hashes of
// the extent): the peer's intact copy of a block in same holds the data
// the source's held, so it mends the source without changing what the
// source says it holds. Both keep need's order.
func RecordedAlike(need []uint32, srcHashes, peerHashes []uint64) (same, other []uint32) {
	for _, b := range need {
		if int(b) < len(peerHashes) && int(b) < len(srcHashes) && peerHashes[b] == srcHashes[b] {
			same = append(same, b)
		} else {
			other = append(other, b)
		}
	}
	return same, other
}
