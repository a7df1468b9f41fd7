package reconcile

import (
	"errors"
	"fmt"
	"tern/volume/ids"
)

// Errors returned by LiveRepair methods called out of turn; test with
// errors.Is.
var (
	// ErrNotRunning means the live repair has completed or was aborted.
	ErrNotRunning = errors.New("live repair is not running")
	// ErrNotUnderRepair means Done named an extent that is not the one
	// under repair.
	ErrNotUnderRepair = errors.New("extent is not under repair")
	// ErrNotAborted means Retry was called on a repair that was not
	// aborted.
	ErrNotAborted = errors.New("live repair was not aborted")
)

// LiveRepairState is the state of a live repair, and so of its target
// replica.
type LiveRepairState int

// Live repair states.
const (
	// LiveRepairRunning: the target replica is repairing, extent by
	// extent, while guest IO continues.
	LiveRepairRunning LiveRepairState = iota + 1
	// LiveRepairComplete: every extent is repaired; the target replica is
	// active again.
	LiveRepairComplete
	// LiveRepairAborted: the repair failed; the target replica is faulted
	// and a retry starts again from extent zero.
	LiveRepairAborted
)

// String returns the state's name.
func (s LiveRepairState) String() string {
	switch s {
	case LiveRepairRunning:
		return "running"
	case LiveRepairComplete:
		return "complete"
	case LiveRepairAborted:
		return "aborted"
	default:
		return fmt.Sprintf("LiveRepairState(%d)", int(s))
	}
}

// WriteRoute tells the upstairs what to do with a guest write (the part of
// it inside one extent) for the replica under live repair. The zero value
// is not a route, so a forgotten decision cannot pass for one.
type WriteRoute int

// Write routes.
const (
	// WriteSend: send the write to the repairing replica now; its extent
	// is already repaired and must be kept current.
	WriteSend WriteRoute = iota + 1
	// WriteAfterRepair: send the write to the repairing replica, ordered
	// after the repair of its extent (a dependency on that repair's jobs),
	// so the copy cannot overwrite it.
	WriteAfterRepair
	// WriteSkip: do not send the write to the repairing replica; its
	// extent is repaired later and the copy brings the data along.
	WriteSkip
)

// String returns the route's name.
func (w WriteRoute) String() string {
	switch w {
	case WriteSend:
		return "send"
	case WriteAfterRepair:
		return "after-repair"
	case WriteSkip:
		return "skip"
	default:
		return fmt.Sprintf("WriteRoute(%d)", int(w))
	}
}

// LiveRepair is the decision core of the live repair of one replica: it
// walks the extents in order, one at a time, and says how guest IO is
// routed to the replica meanwhile. The extents below the one under repair
// form the done set; those above it are still to come.
//
// LiveRepair does no IO and holds no lock: it belongs to the upstairs'
// owner goroutine, which copies the extent Next names and reports Done.
type LiveRepair struct {
	extentCount uint32
	state       LiveRepairState
	// next is the lowest extent not yet repaired: extents below it are
	// done. It equals extentCount once the repair completes.
	next ids.ExtentID
	// repairing reports that next is under repair: Next handed it out and
	// Done has not yet been called for it.
	repairing bool
}

// NewLiveRepair returns a running live repair of a region of extentCount
// extents, starting at extent 0 with no extent under repair. A region of
// no extents is complete at once.
func NewLiveRepair(extentCount uint32) *LiveRepair {
	r := &LiveRepair{extentCount: extentCount}
	r.reset()
	return r
}

func (r *LiveRepair) reset() {
	r.next, r.repairing = 0, false
	r.state = LiveRepairRunning
	if r.extentCount == 0 {
		r.state = LiveRepairComplete
	}
}

// State returns the repair's state.
func (r *LiveRepair) State() LiveRepairState { return r.state }

// ExtentCount returns the number of extents in the region.
func (r *LiveRepair) ExtentCount() uint32 { return r.extentCount }

// Repaired returns the number of extents repaired so far: the size of the
// done set, extents 0 up to Repaired()-1.
func (r *LiveRepair) Repaired() uint32 { return uint32(r.next) }

// UnderRepair returns the extent under repair, if one is.
func (r *LiveRepair) UnderRepair() (ids.ExtentID, bool) {
	if r.state != LiveRepairRunning || !r.repairing {
		return 0, false
	}
	return r.next, true
}

// Next returns the extent to repair now and marks it under repair. If an
// extent is already under repair it returns that one again, so a driver
// that restarts its loop cannot skip an extent. ok is false when the
// repair is not running (complete or aborted).
//
// The driver must order the repair of the returned extent, on the source,
// after every write to that extent submitted before this call: those
// writes were routed WriteSkip for the target and reach it only through
// the copy (the boundary case that lost writes in Crucible issue #893).
func (r *LiveRepair) Next() (e ids.ExtentID, ok bool) {
	if r.state != LiveRepairRunning {
		return 0, false
	}
	r.repairing = true
	return r.next, true
}

// Done records that the extent under repair, e, is repaired. After the
// last extent the repair is complete and the replica is active; the
// driver then flushes it once more, as Crucible does, before counting it
// as a full member.
func (r *LiveRepair) Done(e ids.ExtentID) error {
	if r.state != LiveRepairRunning {
		return fmt.Errorf("finishing repair of extent %d: %w (%s)", e, ErrNotRunning, r.state)
	}
	if !r.repairing || e != r.next {
		return fmt.Errorf("finishing repair of extent %d: %w", e, ErrNotUnderRepair)
	}
	r.next++
	r.repairing = false
	if uint32(r.next) == r.extentCount {
		r.state = LiveRepairComplete
	}
	return nil
}

// Abort ends a running repair: the replica is faulted and receives no more
// writes. Writes the driver holds behind the aborted extent's repair
// (WriteAfterRepair) must be released as skipped for this replica.
// Aborting a repair that is not running does nothing.
func (r *LiveRepair) Abort() {
	if r.state == LiveRepairRunning {
		r.state = LiveRepairAborted
		r.repairing = false
	}
}

// Retry restarts an aborted repair from extent 0: whatever the previous
// attempt copied is compared again, since writes were skipped while the
// replica was faulted.
func (r *LiveRepair) Retry() error {
	if r.state != LiveRepairAborted {
		return fmt.Errorf("retrying live repair: %w (%s)", ErrNotAborted, r.state)
	}
	r.reset()
	return nil
}

// RouteWrite says how a guest write to extent e reaches the replica under
// repair. A write spanning several extents is routed piece by piece.
//
//   - Running, e below the extent under repair (or below the next one when
//     none is): WriteSend, the extent is repaired.
//   - Running, e under repair: WriteAfterRepair.
//   - Running, e above: WriteSkip, the copy will bring it.
//   - Complete: WriteSend, the replica is active.
//   - Aborted: WriteSkip, the replica is faulted.
func (r *LiveRepair) RouteWrite(e ids.ExtentID) WriteRoute {
	switch {
	case r.state == LiveRepairComplete:
		return WriteSend
	case r.state != LiveRepairRunning:
		return WriteSkip
	case e < r.next:
		return WriteSend
	case e == r.next && r.repairing:
		return WriteAfterRepair
	default:
		return WriteSkip
	}
}

// ServesReads reports whether the replica may serve guest reads. A
// replica under repair (or faulted) never does, even from extents already
// repaired: only a complete repair makes it a full reader again.
func (r *LiveRepair) ServesReads() bool { return r.state == LiveRepairComplete }

// ExtentLimit returns the highest extent that receives guest writes on the
// replica — the extent under repair, else the last repaired one — for
// flushes that carry an extent limit. ok is false when no extent does.
func (r *LiveRepair) ExtentLimit() (limit ids.ExtentID, ok bool) {
	switch {
	case r.state == LiveRepairComplete:
		return ids.ExtentID(r.extentCount - 1), r.extentCount > 0
	case r.state != LiveRepairRunning:
		return 0, false
	case r.repairing:
		return r.next, true
	case r.next > 0:
		return r.next - 1, true
	default:
		return 0, false
	}
}

// LiveRepairNeeded reports whether an extent must be copied to the target
// during live repair: after the source extent was flushed and closed, the
// target's version differs from it or the target's copy is dirty. When it
// returns false the extent is skipped (Crucible's ExtentLiveNoOp).
func LiveRepairNeeded(source, target Version) bool {
	return source != target || source.Dirty
}
