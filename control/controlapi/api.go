package controlapi

import (
	"time"

	"tern/instance/apiv1"
)

// InstanceView is an instance as `tern ctl` shows it.
type InstanceView struct {
	ID          string   `json:"id"`
	Name        string   `json:"name"`
	State       string   `json:"state"`
	Host        string   `json:"host"`
	VMM         string   `json:"vmm"`
	VCPUs       int      `json:"vcpus"`
	MemoryMiB   uint64   `json:"memory_mib"`
	Intent      string   `json:"intent"`
	MigrationID string   `json:"migration_id,omitempty"`
	TargetVMM   string   `json:"target_vmm,omitempty"`
	TargetHost  string   `json:"target_host,omitempty"`
	Regions     []string `json:"regions,omitempty"`
	Network     V2PKey   `json:"network"`
}

// HostView is a host as `tern ctl` shows it; VMMs counts the vmm
// processes its records say may still run there (VMMIDs names them).
type HostView struct {
	ID        string    `json:"id"`
	Address   string    `json:"address"`
	State     HostState `json:"state"`
	VMMs      int       `json:"vmms"`
	VMMIDs    []string  `json:"vmm_ids"`
	CPUs      int       `json:"cpus"`
	MemoryMiB uint64    `json:"memory_mib"`
	Build     string    `json:"build"`
}

// CreateInstance is the body of POST /v1/instances.
type CreateInstance struct {
	Name        string          `json:"name"`
	VCPUs       int             `json:"vcpus"`
	MemoryMiB   uint64          `json:"memory_mib"`
	Guest       apiv1.GuestSpec `json:"guest"`
	VolumeBytes uint64          `json:"volume_bytes"`
	Start       bool            `json:"start"`
}

// MigrateRequest is the body of POST /v1/instances/{name}/migrate.
type MigrateRequest struct {
	To string `json:"to,omitempty"`
}

// MigrateSaga is the record of one migration saga: its parameters (all
// chosen before the first step, so every step is a function of them) and
// how far it got. Step is the step started last; StepDone whether it
// finished.
type MigrateSaga struct {
	ID          string `json:"id"`
	InstanceID  string `json:"instance_id"`
	MigrationID string `json:"migration_id"`
	SourceVMM   string `json:"source_vmm"`
	SourceHost  string `json:"source_host"`
	TargetVMM   string `json:"target_vmm"`
	TargetHost  string `json:"target_host"`
	State       string `json:"state"`
	Step        int    `json:"step"`
	StepDone    bool   `json:"step_done"`
	Error       string `json:"error,omitempty"`
}

// Drain is the record of one host's drain: its plan and how far it got.
type Drain struct {
	HostID string `json:"host_id"`
	State  string `json:"state"`
	// Plan is every instance to move and where; Migrations the migration
	// of each, by instance id, once started; Moved counts those
	// completed.
	Plan       []DrainItem       `json:"plan"`
	Migrations map[string]string `json:"migrations"`
	Moved      int               `json:"moved"`
	Error      string            `json:"error,omitempty"`
	Started    time.Time         `json:"started"`
	Finished   *time.Time        `json:"finished,omitempty"`
	// Rev is the record's revision (for ?after_rev= long-polls).
	Rev int64 `json:"rev"`
}

// DrainItem is one instance a drain moves.
type DrainItem struct {
	InstanceID string `json:"instance_id"`
	Name       string `json:"name"`
	VCPUs      int    `json:"vcpus"`
	MemoryMiB  uint64 `json:"memory_mib"`
	Target     string `json:"target"`
}

// LeaderView is GET /v1/leader: this process's URL, whether it leads,
// and the leader's URL as it last saw it ("" when none is known).
type LeaderView struct {
	URL       string `json:"url"`
	Leading   bool   `json:"leading"`
	LeaderURL string `json:"leader_url"`
}
