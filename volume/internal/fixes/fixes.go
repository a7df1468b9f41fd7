// Package fixes names past fixes of the volume's production decision code
// that a test may undo, one at a time, to prove the simulator (volume/sim)
// still catches the bug each one fixed in the code that ships, not in a
// copy of it. Production never undoes one: nothing outside a _test.go file
// calls Undo, and with none undone every check is one atomic load on a
// path taken at reconnects and repairs, never per IO.
package fixes

import "sync/atomic"

// Fix is one past fix.
type Fix uint8

// The fixes a test may undo, each with the commit subject that made it.
const (
	// RepairLostWrites: "a replica that may have lost unflushed writes is
	// repaired, never replayed" (engine.Engine.Rejoin).
	RepairLostWrites Fix = iota
	// HoldWithoutSource: "when no replica is Active the held replicas
	// reconcile as at activation" — undone, a rejoining replica that needs
	// repair is live-repaired with no source (engine.Engine.Rejoin).
	HoldWithoutSource
	// AvoidBadLiveSource: "live repair copies from another source after
	// one served bad data" (engine.Engine.LiveRepairSource).
	AvoidBadLiveSource
	// MendCleanSource: "activation repair mends a clean source's silently
	// damaged blocks from its peers" (reconcile.MendSourceAgain).
	MendCleanSource
	// FlushedOnRejoin: "a rejoining replica is not replayed writes its
	// extents show flushed" (engine.Engine.FlushedOn).
	FlushedOnRejoin
	// NewestDonorFirst: "take an older intact copy from the newest replica
	// first" (reconcile.NewestFirst).
	NewestDonorFirst
	// MendSourceTwice: "activation repair mends a clean source again when
	// it is damaged again after its mend" (reconcile.MendSourceAgain).
	MendSourceTwice

	fixCount
)

var names = [fixCount]string{
	RepairLostWrites:   "repair-lost-writes",
	HoldWithoutSource:  "hold-without-source",
	AvoidBadLiveSource: "avoid-bad-live-source",
	MendCleanSource:    "mend-clean-source",
	FlushedOnRejoin:    "flushed-on-rejoin",
	NewestDonorFirst:   "newest-donor-first",
	MendSourceTwice:    "mend-source-twice",
}

// String names the fix.
func (f Fix) String() string {
	if f < fixCount {
		return names[f]
	}
	return "fix?"
}

// All lists every fix.
func All() []Fix {
	out := make([]Fix, fixCount)
	for i := range out {
		out[i] = Fix(i)
	}
	return out
}

var undone [fixCount]atomic.Bool

// Undone reports whether a test undid f.
func Undone(f Fix) bool { return undone[f].Load() }

// Undo undoes f until the returned function restores it. Only tests call
// it, one fix at a time, around a run that must then fail.
func Undo(f Fix) (restore func()) {
	undone[f].Store(true)
	return func() { undone[f].Store(false) }
}
