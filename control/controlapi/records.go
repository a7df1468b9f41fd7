package controlapi

import (
	"time"

	"tern/instance/apiv1"
	"tern/volume/ids"
)

// HostState is a host's place in the drain lifecycle.
type HostState string

// Host states.
const (
	HostActive   HostState = "active"
	HostDraining HostState = "draining"
	HostDrained  HostState = "drained"
)

// Host is one agent's host: where it listens and what it offers.
type Host struct {
	ID      string    `json:"id"`
	Address string    `json:"address"`
	State   HostState `json:"state"`
	// CPUs and MemoryMiB are the capacity the agent offers to vmms.
	CPUs      int    `json:"cpus"`
	MemoryMiB uint64 `json:"memory_mib"`
	// Build and MigrationProtocols are the agent's tern version.
	Build              string   `json:"build"`
	MigrationProtocols []uint16 `json:"migration_protocols"`
	// Underlay is the host's data-plane IPv4, if its agent runs one.
	Underlay string `json:"underlay,omitempty"`
	// RegisteredAt is the agent's last registration.
	RegisteredAt time.Time `json:"registered_at"`
}

// InstanceIntent is what the operator last asked of an instance.
type InstanceIntent string

// Instance intents.
const (
	IntentRunning InstanceIntent = "running"
	IntentStopped InstanceIntent = "stopped"
)

// Instance is a VM as the operator sees it: its shape, its volume, and the
// vmm that runs it.
type Instance struct {
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	VCPUs     int             `json:"vcpus"`
	MemoryMiB uint64          `json:"memory_mib"`
	Guest     apiv1.GuestSpec `json:"guest"`
	// Volume is the instance's volume, nil for none.
	Volume *Volume        `json:"volume,omitempty"`
	Intent InstanceIntent `json:"intent"`
	// ActiveVMM is the vmm that runs (or last ran) the instance; empty
	// when none does.
	ActiveVMM string `json:"active_vmm,omitempty"`
	// TargetVMM and MigrationID are set while a migration is in flight.
	TargetVMM   string `json:"target_vmm,omitempty"`
	MigrationID string `json:"migration_id,omitempty"`
	// Failed is set when the last vmm failed or vanished.
	Failed bool `json:"failed,omitempty"`
	// Network is the instance's virtual address.
	Network V2PKey    `json:"network"`
	Created time.Time `json:"created"`
}

// Volume is an instance's replicated volume: three regions on three hosts.
type Volume struct {
	Regions      []string `json:"regions"`
	BlockSize    uint32   `json:"block_size"`
	ExtentBlocks uint32   `json:"extent_blocks"`
	ExtentCount  uint32   `json:"extent_count"`
	// Gen is above every generation a vmm activated the volume with.
	Gen ids.Generation `json:"gen"`
}

// VMM is one `tern vmm serve` process: its host and its last report.
type VMM struct {
	ID         string `json:"id"`
	InstanceID string `json:"instance_id"`
	HostID     string `json:"host_id"`
	// State and Gen are the vmm's last reported snapshot (Gen 0: none
	// yet). Gone means its process exited or its agent no longer has it.
	State apiv1.State   `json:"state,omitzero"`
	Gen   apiv1.ViewGen `json:"gen"`
	Gone  bool          `json:"gone,omitempty"`
	// URL and MigrationAddr are the vmm's endpoints, once it runs.
	URL           string `json:"url,omitempty"`
	MigrationAddr string `json:"migration_addr,omitempty"`
	// In and Out are the migration halves of its last report.
	In  *MigrationHalf `json:"migration_in,omitempty"`
	Out *MigrationHalf `json:"migration_out,omitempty"`
	// VCPUs and MemoryMiB are reserved on the host while the vmm lives.
	VCPUs     int       `json:"vcpus"`
	MemoryMiB uint64    `json:"memory_mib"`
	Created   time.Time `json:"created"`
	// Unwound marks a vmm whose saga unwound: it holds no resources.
	Unwound bool `json:"unwound,omitempty"`
}

// HoldsResources reports whether v still counts against its host.
func (v *VMM) HoldsResources() bool {
	return !v.Gone && !v.Unwound && v.State != apiv1.Destroyed && v.State != apiv1.Failed
}

// ProcessLive reports whether v's process may still run on its host:
// what a drain waits out.
func (v *VMM) ProcessLive() bool { return !v.Gone && !v.Unwound }

// MigrationHalf is one side's view of a migration, as its vmm reported it.
type MigrationHalf struct {
	ID         string  `json:"id"`
	Phase      string  `json:"phase"`
	BytesSent  uint64  `json:"bytes_sent"`
	Round      uint64  `json:"round"`
	TotalMs    float64 `json:"total_ms,omitempty"`
	DowntimeMs float64 `json:"downtime_ms,omitempty"`
	Error      string  `json:"error,omitempty"`
}

// MigrationState is a migration's lifecycle (Omicron's names).
type MigrationState string

// Migration states.
const (
	MigrationPending    MigrationState = "pending"
	MigrationInProgress MigrationState = "in_progress"
	MigrationCompleted  MigrationState = "completed"
	MigrationFailed     MigrationState = "failed"
)

// Migration is one live migration of an instance between two vmms.
type Migration struct {
	ID         string         `json:"id"`
	InstanceID string         `json:"instance_id"`
	State      MigrationState `json:"state"`
	SourceVMM  string         `json:"source_vmm"`
	TargetVMM  string         `json:"target_vmm"`
	SourceHost string         `json:"source_host"`
	TargetHost string         `json:"target_host"`
	// SourceGen and TargetGen are each side's last reported generation.
	SourceGen  apiv1.ViewGen `json:"source_gen"`
	TargetGen  apiv1.ViewGen `json:"target_gen"`
	Started    time.Time     `json:"started"`
	Finished   *time.Time    `json:"finished,omitempty"`
	BytesSent  uint64        `json:"bytes_sent"`
	Rounds     uint64        `json:"rounds"`
	TotalMs    float64       `json:"total_ms"`
	DowntimeMs float64       `json:"downtime_ms"`
	Error      string        `json:"error,omitempty"`
	// Rev is the record's revision as served (for ?after_rev= long-polls).
	Rev int64 `json:"rev,omitempty"`
}

// Region is one replica of an instance's volume on one host.
type Region struct {
	ID         string `json:"id"`
	InstanceID string `json:"instance_id"`
	HostID     string `json:"host_id"`
	// UUID is the volume's region UUID, shared by its three replicas.
	UUID string `json:"uuid"`
	// Addr is where its downstairs listens, once created.
	Addr string `json:"addr,omitempty"`
}

// V2PKey is an instance's virtual address.
type V2PKey struct {
	IP  string `json:"ip"`
	VNI uint32 `json:"vni"`
}

// V2P maps an instance's virtual address to the host serving it.
type V2P struct {
	V2PKey
	InstanceID string `json:"instance_id"`
	HostID     string `json:"host_id"`
	// HostAddress is the host's agent address (its physical address).
	HostAddress string `json:"host_address"`
}
