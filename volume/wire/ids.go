package wire

import (
	"github.com/google/uuid"

	"tern/volume/ids"
)

// JobID names one request within a session. The upstairs assigns job IDs in
// increasing order; every reply carries the JobID of its request.
type JobID uint64

// ProtocolVersion is a version of this wire protocol.
type ProtocolVersion uint32

// Protocol versions.
const (
	// Version1 is the first protocol version.
	Version1 ProtocolVersion = 1
	// CurrentVersion is the newest version this package speaks.
	CurrentVersion = Version1
)

// SupportedVersions lists, in increasing order, every version this package
// speaks. Callers must not modify it.
var SupportedVersions = []ProtocolVersion{Version1}

// ChooseVersion returns the highest version present both in offered and in
// SupportedVersions, or false when they share none.
func ChooseVersion(offered []ProtocolVersion) (ProtocolVersion, bool) {
	var best ProtocolVersion
	found := false
	for _, o := range offered {
		for _, s := range SupportedVersions {
			if o == s && (!found || o > best) {
				best, found = o, true
			}
		}
	}
	return best, found
}

// RegionInfo is the geometry of a region.
type RegionInfo struct {
	// UUID identifies the region; all replicas of one volume share it.
	UUID uuid.UUID
	// BlockSize is the size of a block in bytes.
	BlockSize uint32
	// ExtentBlocks is the number of blocks in each extent.
	ExtentBlocks uint32
	// ExtentCount is the number of extents in the region.
	ExtentCount uint32
}

// Blocks returns the number of blocks in the region.
func (r RegionInfo) Blocks() uint64 { return uint64(r.ExtentBlocks) * uint64(r.ExtentCount) }

// ExtentVersion is the durable state of one extent: the generation and flush
// number of its last flush and whether it was written since.
type ExtentVersion struct {
	// Gen is the generation of the last flush.
	Gen ids.Generation
	// Flush is the flush number of the last flush.
	Flush uint64
	// Dirty reports a write since the last flush.
	Dirty bool
}
