package apiv1

import (
	"encoding/json"
	"fmt"
)

// Phase is a step of a migration, as published in Progress: the one
// definition the migration engines, the instance controller, the API, the
// client and tern migrate share. Its text form is the API's ("ram_push").
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

// Valid reports whether p is one of the phases.
func (p Phase) Valid() bool {
	_, ok := phaseNames[p]
	return ok
}

// String returns the phase's API name, or "phase(N)" for an invalid value.
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

// Progress is one direction of a migration as it is published: what the
// engines report (OnProgress), what the instance controller publishes as
// migration.in (target) or migration.out (source), what the API returns
// and what the client and tern migrate read. It is a value with no
// pointers, so a published snapshot shares nothing with the next one.
//
// The zero value means no migration in that direction and is JSON null;
// otherwise it is {"id","phase","round","bytes_sent","pages_remaining",
// "dirty_pages_per_sec","bandwidth_bytes_per_sec","estimated_downtime_ms"},
// plus "total_ms" and "downtime_ms" at finish, "pause_breakdown" at
// finish (PauseBreakdown) and "error" with phase error.
type Progress struct {
	// ID is the migration's id (the target's Offer.MigrationID).
	ID    string `json:"id"`
	Phase Phase  `json:"phase"`
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
	// PauseBreakdown is where the pause went, set at finish: every part
	// on the source's, only the target's own parts on the target's.
	PauseBreakdown PauseBreakdown `json:"pause_breakdown,omitzero"`
	// Error is the reason, set with PhaseError.
	Error string `json:"error,omitempty"`
}

// PauseBreakdown splits a migration's pause (the source's pause request
// to the target's resumed message reaching the source) into its parts, in
// whole microseconds. The source's parts are disjoint stretches of its own
// clock; the target's (RestoreUs, ResumeUs) each happen while the source
// waits for that step's answer, which no source part covers, so the parts
// never sum to more than TotalUs. OtherUs is TotalUs less the parts: the
// messages' transit and the phase announcements.
type PauseBreakdown struct {
	// StopUs is the source parking its vCPUs (vmm.VM.Pause).
	StopUs int64 `json:"stop_us"`
	// QuiesceUs waits for a Linux guest's virtio requests in flight.
	QuiesceUs int64 `json:"quiesce_us"`
	// FlushUs flushes the disks (the source's AfterPause).
	FlushUs int64 `json:"flush_us"`
	// HarvestUs is the last dirty harvest (KVM's log and the VMM's
	// bitmaps); zero on the same-host path.
	HarvestUs int64 `json:"harvest_us"`
	// LastPagesUs sends the last dirty pages until the target
	// acknowledges them; zero on the same-host path.
	LastPagesUs int64 `json:"last_pages_us"`
	// DeviceStateUs saves the device state and sends it.
	DeviceStateUs int64 `json:"device_state_us"`
	// RestoreUs is the target loading the device state.
	RestoreUs int64 `json:"restore_us"`
	// FinishUs is the source's wait for the target's finish-ready (its
	// volumes activated), from announcing phase finish.
	FinishUs int64 `json:"finish_us"`
	// ResumeUs is the target from reading commit to every vCPU out of
	// its pause.
	ResumeUs int64 `json:"resume_us"`
	// OtherUs is TotalUs less every part above.
	OtherUs int64 `json:"other_us"`
	// TotalUs is the pause as the source measures it.
	TotalUs int64 `json:"total_us"`
}

// PartsUs sums the measured parts (OtherUs and TotalUs excluded).
func (b PauseBreakdown) PartsUs() int64 {
	return b.StopUs + b.QuiesceUs + b.FlushUs + b.HarvestUs + b.LastPagesUs + b.DeviceStateUs + b.RestoreUs + b.FinishUs + b.ResumeUs
}

// progressFields is Progress without its JSON methods, so they can
// encode and decode its fields.
type progressFields Progress

// Active reports whether p describes a migration (is not the zero value).
func (p Progress) Active() bool { return p != Progress{} }

// MarshalJSON writes null for the zero value, else the object.
func (p Progress) MarshalJSON() ([]byte, error) {
	if !p.Active() {
		return []byte("null"), nil
	}
	return json.Marshal(progressFields(p))
}

// UnmarshalJSON reads null as the zero value, else the object.
func (p *Progress) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		*p = Progress{}
		return nil
	}
	var f progressFields
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	*p = Progress(f)
	return nil
}

// MigrationVersion is a migration protocol version, as GET /v1/version
// lists them (migration_protocols) and as the migration engines' hello
// offers them. Which versions a build speaks is the engines' to say
// (migration.SupportedVersions).
type MigrationVersion uint16
