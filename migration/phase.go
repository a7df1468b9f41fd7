package migration

import "fmt"

// Phase is a step of a migration, as published in Progress.
type Phase uint8

// The phases, in protocol order; PhaseError ends a failed migration.
const (
	PhaseSync Phase = 1 + iota
	PhaseRAMPush
	PhasePause
	PhaseRAMPushDirty
	PhaseDevice
	PhaseFinish
	PhaseError
)

var phaseNames = map[Phase]string{
	PhaseSync:         "sync",
	PhaseRAMPush:      "ram_push",
	PhasePause:        "pause",
	PhaseRAMPushDirty: "ram_push_dirty",
	PhaseDevice:       "device",
	PhaseFinish:       "finish",
	PhaseError:        "error",
}

// Phases lists the phases of a successful migration in order.
var Phases = []Phase{PhaseSync, PhaseRAMPush, PhasePause, PhaseRAMPushDirty, PhaseDevice, PhaseFinish}

func (p Phase) String() string {
	if n, ok := phaseNames[p]; ok {
		return n
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// ParsePhase returns the phase named s.
func ParsePhase(s string) (Phase, error) {
	for p, n := range phaseNames {
		if n == s {
			return p, nil
		}
	}
	return 0, fmt.Errorf("parsing phase: unknown phase %q", s)
}

// MarshalText names the phase.
func (p Phase) MarshalText() ([]byte, error) {
	if _, ok := phaseNames[p]; !ok {
		return nil, fmt.Errorf("marshaling phase: unknown phase %d", uint8(p))
	}
	return []byte(p.String()), nil
}

// UnmarshalText parses a phase name.
func (p *Phase) UnmarshalText(b []byte) error {
	v, err := ParsePhase(string(b))
	if err != nil {
		return err
	}
	*p = v
	return nil
}

// Progress is one published snapshot of a migration, the object the
// controller publishes as migration.in or migration.out.
type Progress struct {
	Phase Phase `json:"phase"`
	// Round is the pre-copy round in progress or last sent (1: the full
	// copy).
	Round int `json:"round"`
	// BytesSent counts page bytes sent (source) or received (target).
	BytesSent uint64 `json:"bytes_sent"`
	// PagesRemaining is what the next round or the paused copy must send,
	// as of the last harvest.
	PagesRemaining uint64 `json:"pages_remaining"`
	// DirtyPagesPerSec is the guest's dirtying rate over the last round.
	DirtyPagesPerSec float64 `json:"dirty_pages_per_sec"`
	// BandwidthBytesPerSec is the measured transfer rate.
	BandwidthBytesPerSec float64 `json:"bandwidth_bytes_per_sec"`
	// EstimatedDowntimeMs is PagesRemaining at that bandwidth.
	EstimatedDowntimeMs float64 `json:"estimated_downtime_ms"`
	// TotalMs and DowntimeMs are set at finish: the whole migration, and
	// the time from the source's pause to the target's resume.
	TotalMs    float64 `json:"total_ms,omitempty"`
	DowntimeMs float64 `json:"downtime_ms,omitempty"`
	// Error is set with PhaseError.
	Error string `json:"error,omitempty"`
}
