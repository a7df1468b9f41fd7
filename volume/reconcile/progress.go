package reconcile

import (
	"time"
)

// Phase is the stage a repair is in. The JSON strings are part of the
// external progress contract.
type Phase string

// Phases, in the order a repair passes through them. A run starts in
// PhaseNegotiating and ends in exactly one of PhaseDone or PhaseError.
const (
	// PhaseNegotiating: connecting to replicas and waiting for a quorum.
	PhaseNegotiating Phase = "negotiating"
	// PhaseComparing: collecting extent versions and planning repairs.
	PhaseComparing Phase = "comparing"
	// PhaseRepairing: comparing block hashes of the planned extents and
	// copying the blocks that differ.
	PhaseRepairing Phase = "repairing"
	// PhaseLiveRepair: repairing one replica extent by extent while guest
	// IO continues.
	PhaseLiveRepair Phase = "live_repair"
	// PhaseDone: the repair finished; every counter is at its total.
	PhaseDone Phase = "done"
	// PhaseError: the repair failed; counters keep their last values.
	PhaseError Phase = "error"
)

// rank orders phases: a tracker only moves to a phase of higher rank.
// Unknown phases rank -1.
func (p Phase) rank() int {
	switch p {
	case PhaseNegotiating:
		return 0
	case PhaseComparing:
		return 1
	case PhaseRepairing:
		return 2
	case PhaseLiveRepair:
		return 3
	case PhaseDone, PhaseError:
		return 4
	default:
		return -1
	}
}

// Terminal reports whether p ends a run (PhaseDone or PhaseError).
func (p Phase) Terminal() bool { return p == PhaseDone || p == PhaseError }

// Progress is one snapshot of a repair's progress: the object activation
// and live repair publish, pulled through the API and pushed to watchers.
// Its JSON keys are an external contract.
//
// Within one run every counter only grows, ExtentsDone ≤ ExtentsTotal and
// BytesDone ≤ BytesTotal, and the phase only moves forward.
type Progress struct {
	// Phase is the current stage.
	Phase Phase `json:"phase"`
	// ExtentsTotal is the number of extents the run must repair, as known
	// so far; it grows when more divergence is found.
	ExtentsTotal uint64 `json:"extents_total"`
	// ExtentsDone is the number of extents repaired.
	ExtentsDone uint64 `json:"extents_done"`
	// BlocksCompared is the number of block hashes compared.
	BlocksCompared uint64 `json:"blocks_compared"`
	// BytesTotal is the number of bytes the run must copy, as known so
	// far; it grows when more differing blocks are found.
	BytesTotal uint64 `json:"bytes_total"`
	// BytesDone is the number of bytes copied.
	BytesDone uint64 `json:"bytes_done"`
	// BytesPerSec is the average copy rate since the copying phase began;
	// zero before any byte is copied.
	BytesPerSec float64 `json:"bytes_per_sec"`
	// EtaSeconds estimates the seconds left; meaningful only while
	// BytesPerSec or ExtentsDone is non-zero, and zero once the run ends.
	EtaSeconds float64 `json:"eta_seconds"`
	// StartedAt is when the run started.
	StartedAt time.Time `json:"started_at"`
	// UpdatedAt is when this snapshot was taken; it never goes backwards.
	UpdatedAt time.Time `json:"updated_at"`
}
