package apiv1

import "time"

// ViewGen numbers the views an instance publishes: the first is 1 and
// each publish adds exactly 1. It is what GET /v1/instance/state?after_gen
// waits past. It counts publishes and nothing else: the fencing generation
// a volume is activated with is a different number (ids.Generation, in
// BackendSpec.Gen).
type ViewGen uint64

// View is one published state of an instance: what GET
// /v1/instance/state returns and what a watcher long-polls for. Its fields
// change only together: everything in one view was true at once.
type View struct {
	Gen       ViewGen   `json:"gen"`
	State     State     `json:"state"`
	Migration Migration `json:"migration"`
}

// Migration is the instance's migration in each direction.
type Migration struct {
	In  Progress `json:"in"`
	Out Progress `json:"out"`
}

// Instance is GET /v1/instance (and the body of a 201 ensure): the
// latest view's state and gen with the spec, the disks and the endpoints.
type Instance struct {
	ID        string       `json:"id"`
	State     State        `json:"state"`
	Gen       ViewGen      `json:"gen"`
	Spec      Spec         `json:"spec"`
	Disks     []DiskStatus `json:"disks"`
	Migration Migration    `json:"migration"`
	// MigrationAddr is this VMM's migration endpoint (host:port, QUIC
	// with mutual TLS), when it listens for migration.
	MigrationAddr string `json:"migration_addr,omitempty"`
	// Error is why the instance failed, when its state is failed.
	Error string `json:"error,omitempty"`
	// StopReason is why the instance stopped, once it is stopping or
	// past: "stop requested", "guest exited with status N", "guest
	// powered off", "migrated out", ….
	StopReason string `json:"stop_reason,omitempty"`
}

// Disk states published in DiskStatus.State.
const (
	DiskOpening    = "opening"
	DiskReady      = "ready"
	DiskActivating = "activating"
	DiskActive     = "active"
	DiskFailed     = "failed"
	DiskClosed     = "closed"
)

// DiskStatus is one disk as GET /v1/instance and /v1/instance/disks/{name}
// show it.
type DiskStatus struct {
	Name  string `json:"name"`
	Kind  string `json:"kind"`
	State string `json:"state"`
	// Activation is the volume's activation and repair progress; nil for
	// a file disk.
	Activation *RepairProgress `json:"activation"`
	// Error is why the disk failed, if it did.
	Error string `json:"error,omitempty"`
	// Replicas are a volume's downstairs (only in the per-disk view).
	Replicas []ReplicaStatus `json:"replicas,omitempty"`
}

// ReplicaStatus is one downstairs of a volume disk.
type ReplicaStatus struct {
	Target      string          `json:"target"`
	State       string          `json:"state"`
	LastError   string          `json:"last_error,omitempty"`
	FaultReason string          `json:"fault_reason,omitempty"`
	Repair      *RepairProgress `json:"repair,omitempty"`
}

// RepairPhase is the stage of a volume's activation or repair, as the
// volume's planner (volume/reconcile) names it.
type RepairPhase string

// The repair phases, in the order a run passes through them; a run ends
// in exactly one of RepairDone and RepairError.
const (
	RepairNegotiating RepairPhase = "negotiating"
	RepairComparing   RepairPhase = "comparing"
	RepairRepairing   RepairPhase = "repairing"
	RepairLiveRepair  RepairPhase = "live_repair"
	RepairDone        RepairPhase = "done"
	RepairError       RepairPhase = "error"
)

// Terminal reports whether p ends a run.
func (p RepairPhase) Terminal() bool { return p == RepairDone || p == RepairError }

// RepairProgress is a volume's activation or repair progress as the API
// shows it: the fields and JSON keys of reconcile.Progress, which the
// controller copies into it. Within one run every counter only grows and
// the phase only moves forward.
type RepairProgress struct {
	Phase RepairPhase `json:"phase"`
	// ExtentsTotal is the number of extents the run must repair, as known
	// so far; ExtentsDone those repaired.
	ExtentsTotal uint64 `json:"extents_total"`
	ExtentsDone  uint64 `json:"extents_done"`
	// BlocksCompared is the number of block hashes compared.
	BlocksCompared uint64 `json:"blocks_compared"`
	// BytesTotal is the number of bytes the run must copy, as known so
	// far; BytesDone those copied.
	BytesTotal uint64 `json:"bytes_total"`
	BytesDone  uint64 `json:"bytes_done"`
	// BytesPerSec is the average copy rate since copying began.
	BytesPerSec float64 `json:"bytes_per_sec"`
	// EtaSeconds estimates the seconds left; zero once the run ends.
	EtaSeconds float64   `json:"eta_seconds"`
	StartedAt  time.Time `json:"started_at"`
	UpdatedAt  time.Time `json:"updated_at"`
}
