package apiv1

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"tern/volume/ids"
)

// Spec is what PUT /v1/instance asks for: a deterministic description of
// an instance, validated before anything is built (instance.Validate). It
// is kept apart from the controller that owns the live objects.
type Spec struct {
	// ID names the instance; an ensure repeating the ID and spec of the
	// live instance is idempotent.
	ID string `json:"id"`
	// Name is free text for operators.
	Name string `json:"name"`
	// VCPUs is the number of vCPUs, at least 1 and at most the host's KVM
	// limit.
	VCPUs int `json:"vcpus"`
	// MemoryMiB is the size of guest RAM in MiB.
	MemoryMiB uint64 `json:"memory_mib"`
	// Guest is what the VM boots.
	Guest GuestSpec `json:"guest"`
	// Disks are the instance's block devices, each with a unique name.
	Disks []DiskSpec `json:"disks"`
	// NICs are the instance's network cards: virtio-net on host TAP
	// interfaces, nics[j] in the VM's slot vmm.NICSlot(j).
	NICs []NICSpec `json:"nics,omitempty"`
	// Components are named extra devices; each has a kind.
	Components map[string]ComponentSpec `json:"components,omitempty"`
	// Init says how the instance comes to be: "spec" (built from this
	// spec).
	Init InitSpec `json:"init"`
}

// Guest kinds.
const (
	GuestELF   = "elf"
	GuestLinux = "linux"
)

// GuestSpec is the guest the VM boots: an ELF file or built-in guest
// (kind "elf", Path), or a Linux kernel (kind "linux", Kernel, Initrd,
// Cmdline).
type GuestSpec struct {
	Kind string `json:"kind"`
	// Path is an ELF file's path, or a built-in guest's name (vmm/guests)
	// when it has no '/' and does not end in ".elf".
	Path    string `json:"path,omitempty"`
	Kernel  string `json:"kernel,omitempty"`
	Initrd  string `json:"initrd,omitempty"`
	Cmdline string `json:"cmdline,omitempty"`
	// Params are a built-in guest's parameters (see instance.guestParams).
	Params map[string]uint64 `json:"params,omitempty"`
}

// NICSpec is one network card: the host's TAP interface it is on, and
// its MAC ("52:54:00:12:34:56"); with no MAC the card gets
// vmm.NICMAC(TAP), the same for the same TAP name.
type NICSpec struct {
	TAP string `json:"tap"`
	MAC string `json:"mac,omitempty"`
}

// Disk backend kinds.
const (
	BackendFile   = "file"
	BackendVolume = "volume"
)

// DiskSpec is one block device.
type DiskSpec struct {
	Name    string      `json:"name"`
	Backend BackendSpec `json:"backend"`
}

// BackendSpec is a disk's storage: a local file (kind "file", Path) or a
// volume (kind "volume": its downstairs Targets, the Region each serves,
// the activation generation Gen, and QuorumWaitMs, how long activation
// waits for every downstairs before going ahead with a quorum). Layout
// says how the volume spreads over its targets: three replicas (nil or
// kind "replicated"), or erasure-coded shards (kind "ec", Data + Parity
// targets, data shards first).
type BackendSpec struct {
	Kind         string         `json:"kind"`
	Path         string         `json:"path,omitempty"`
	Targets      []string       `json:"targets,omitempty"`
	Layout       *LayoutSpec    `json:"layout,omitempty"`
	Region       *RegionSpec    `json:"region,omitempty"`
	Gen          ids.Generation `json:"gen,omitempty"`
	QuorumWaitMs *uint64        `json:"quorum_wait_ms,omitempty"`
}

// Volume layout kinds.
const (
	LayoutReplicated = "replicated"
	LayoutEC         = "ec"
)

// LayoutSpec is a volume's layout: kind "replicated", or kind "ec" with
// Data data shards and Parity parity shards.
type LayoutSpec struct {
	Kind   string `json:"kind"`
	Data   int    `json:"data,omitempty"`
	Parity int    `json:"parity,omitempty"`
}

// ErasureCoded reports whether b is an erasure-coded volume.
func (b BackendSpec) ErasureCoded() bool { return b.Layout != nil && b.Layout.Kind == LayoutEC }

// VolumeSizeBytes is the size of b's volume: its region for a
// replicated one; for an erasure-coded one, Data regions but each
// shard's metadata block.
func (b BackendSpec) VolumeSizeBytes() uint64 {
	if b.Region == nil {
		return 0
	}
	if b.ErasureCoded() {
		blocks := uint64(b.Region.ExtentBlocks)*uint64(b.Region.ExtentCount) - 1
		return uint64(b.Layout.Data) * blocks * uint64(b.Region.BlockSize)
	}
	return b.Region.SizeBytes()
}

// RegionSpec is the geometry a volume's replicas must serve.
type RegionSpec struct {
	BlockSize    uint32 `json:"block_size"`
	ExtentBlocks uint32 `json:"extent_blocks"`
	ExtentCount  uint32 `json:"extent_count"`
}

// SizeBytes is the region's size.
func (r RegionSpec) SizeBytes() uint64 {
	return uint64(r.BlockSize) * uint64(r.ExtentBlocks) * uint64(r.ExtentCount)
}

// ComponentSpec is one named extra device: its Kind, and the rest of its
// JSON object kept as it came for the kind's own parser.
type ComponentSpec struct {
	Kind string
	// Raw is the whole JSON object, kind included.
	Raw json.RawMessage
}

// UnmarshalJSON reads an object with a "kind" and keeps the whole of it.
func (c *ComponentSpec) UnmarshalJSON(b []byte) error {
	var k struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(b, &k); err != nil {
		return fmt.Errorf("parsing component: %w", err)
	}
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return fmt.Errorf("parsing component: %w", err)
	}
	c.Kind, c.Raw = k.Kind, buf.Bytes()
	return nil
}

// MarshalJSON writes the object as it came.
func (c ComponentSpec) MarshalJSON() ([]byte, error) {
	if len(c.Raw) == 0 {
		return json.Marshal(struct {
			Kind string `json:"kind"`
		}{c.Kind})
	}
	return c.Raw, nil
}

// Init methods.
const (
	InitSpecMethod      = "spec"
	InitMigrationTarget = "migration_target"
)

// InitSpec says how the instance is initialised: "spec" (built from
// the spec), or "migration_target" (migrated in from the VMM whose
// migration endpoint is Source; the spec then gives only the id, the
// disks' backends to replace and the target's own components).
type InitSpec struct {
	Method string `json:"method"`
	// Source is the source VMM's migration_addr (host:port).
	Source string `json:"source,omitempty"`
	// MigrationID names the migration in both sides' published status.
	MigrationID string `json:"migration_id,omitempty"`
	// DowntimeTargetMs is the pause the source aims for (default
	// DefaultDowntimeTargetMs).
	DowntimeTargetMs *uint64 `json:"downtime_target_ms,omitempty"`
	// SameHost asks for the memfd hand-over: no page is copied.
	SameHost bool `json:"same_host,omitempty"`
}

// DefaultDowntimeTargetMs is a migration's downtime target when the
// ensure gives none.
const DefaultDowntimeTargetMs = 30

// ErrMalformedSpec wraps a body that is not a spec: bad JSON, a wrong
// type, an unknown field, trailing data.
var ErrMalformedSpec = errors.New("malformed spec")

// DecodeSpec parses a spec strictly: unknown fields anywhere (but inside a
// component, which its kind parses) and trailing data are errors wrapping
// ErrMalformedSpec.
func DecodeSpec(b []byte) (Spec, error) {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return Spec{}, fmt.Errorf("%w: %w", ErrMalformedSpec, err)
	}
	if dec.More() {
		return Spec{}, fmt.Errorf("%w: data after the JSON object", ErrMalformedSpec)
	}
	return s, nil
}

// Equal reports whether two specs ask for the same instance (their
// canonical JSON is the same).
func (s Spec) Equal(o Spec) bool {
	a, err1 := json.Marshal(s)
	b, err2 := json.Marshal(o)
	return err1 == nil && err2 == nil && bytes.Equal(a, b)
}
