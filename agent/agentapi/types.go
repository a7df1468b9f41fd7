package agentapi

import (
	"encoding/json"

	"tern/instance/apiv1"
)

// InventoryGen numbers the versions of a host's inventory the agent
// publishes: a publish counter, not a fencing generation
// (ids.Generation) nor an instance view's (apiv1.ViewGen).
type InventoryGen uint64

// Inventory is what a host offers and runs.
type Inventory struct {
	HostID  string `json:"host_id"`
	Address string `json:"address"`
	// Gen counts the inventory's changes since the agent started (GET
	// /v1/inventory?after_gen=N waits for a newer one).
	Gen InventoryGen `json:"gen"`
	// Registered is set once the control plane took the host's
	// registration.
	Registered bool `json:"registered"`
	// CPUs and MemoryMiB are the capacity offered to vmms; Allocated*
	// what the live vmms reserve of it.
	CPUs               int           `json:"cpus"`
	MemoryMiB          uint64        `json:"memory_mib"`
	AllocatedCPUs      int           `json:"allocated_cpus"`
	AllocatedMemoryMiB uint64        `json:"allocated_memory_mib"`
	Version            apiv1.Version `json:"version"`
	VMMs               []VMMStatus   `json:"vmms"`
	Regions            []Region      `json:"regions"`
}

// EnsureVMM is the body of PUT /v1/vmms/{id}: the instance it runs, what
// it reserves, the spec its vmm is ensured with (an instance spec, or a
// migration target's), and whether to ask it to run.
type EnsureVMM struct {
	InstanceID string          `json:"instance_id"`
	VCPUs      int             `json:"vcpus"`
	MemoryMiB  uint64          `json:"memory_mib"`
	Spec       json.RawMessage `json:"spec"`
	Run        bool            `json:"run,omitempty"`
}

// VMMStatus is one vmm as its agent knows it.
type VMMStatus struct {
	ID            string        `json:"id"`
	InstanceID    string        `json:"instance_id"`
	URL           string        `json:"url"`
	MigrationAddr string        `json:"migration_addr,omitempty"`
	State         apiv1.State   `json:"state"`
	Gen           apiv1.ViewGen `json:"gen"`
	Gone          bool          `json:"gone,omitempty"`
	VCPUs         int           `json:"vcpus"`
	MemoryMiB     uint64        `json:"memory_mib"`
}

// Report is one vmm snapshot relayed to the control plane (POST
// /v1/reports there).
type Report struct {
	HostID     string          `json:"host_id"`
	VMMID      string          `json:"vmm_id"`
	InstanceID string          `json:"instance_id"`
	Gen        apiv1.ViewGen   `json:"gen"`
	State      apiv1.State     `json:"state"`
	Gone       bool            `json:"gone,omitempty"`
	In         *apiv1.Progress `json:"migration_in,omitempty"`
	Out        *apiv1.Progress `json:"migration_out,omitempty"`
}

// RegionSpec is the body of PUT /v1/regions/{id}.
type RegionSpec struct {
	UUID         string `json:"uuid"`
	BlockSize    uint32 `json:"block_size"`
	ExtentBlocks uint32 `json:"extent_blocks"`
	ExtentCount  uint32 `json:"extent_count"`
}

// Region is one region and the address its downstairs serves.
type Region struct {
	ID   string `json:"id"`
	UUID string `json:"uuid"`
	Addr string `json:"addr"`
}

// Mapping is one virtual-to-physical network mapping.
type Mapping struct {
	IP          string `json:"ip"`
	VNI         uint32 `json:"vni"`
	InstanceID  string `json:"instance_id"`
	HostID      string `json:"host_id"`
	HostAddress string `json:"host_address"`
	// HostUnderlay is the host's data-plane (underlay) IPv4, when its
	// agent runs a data plane; without it the IP of HostAddress is used.
	HostUnderlay string `json:"host_underlay,omitempty"`
}

// Registration is the body of PUT /v1/hosts/{id} on the control plane.
type Registration struct {
	Address            string   `json:"address"`
	CPUs               int      `json:"cpus"`
	MemoryMiB          uint64   `json:"memory_mib"`
	Build              string   `json:"build"`
	MigrationProtocols []uint16 `json:"migration_protocols"`
	// Underlay is the host's data-plane IPv4 (agent --dataplane), if any.
	Underlay string `json:"underlay,omitempty"`
	// VMMs are the vmms the agent runs as it registers: a vmm the
	// control plane has on this host and the agent does not run is gone
	// (a restarted agent runs none; its children died with it).
	VMMs []string `json:"vmms"`
}

// CodeNoSuchVMM is the error code of a vmm the agent does not run.
const CodeNoSuchVMM = "no_such_vmm"
