package wire

// Frame layout and limits.
const (
	// FrameMagic starts every frame header ("tn" in little endian).
	FrameMagic uint16 = 0x6e74
	// HeaderSize is the size of a frame header in bytes.
	HeaderSize = 8
	// MaxDataSize is the largest bulk data a message may carry (1 MiB; the
	// upstairs splits larger IO).
	MaxDataSize = 1 << 20
	// MaxPayload is the largest payload after the header: bulk data plus
	// room for fixed fields, dependencies and per-block hashes.
	MaxPayload = MaxDataSize + 64<<10
	// MaxFrameSize is the largest frame on the wire.
	MaxFrameSize = HeaderSize + MaxPayload
	// MaxVersions bounds Hello.Versions.
	MaxVersions = 16
	// MaxDeps bounds the dependency list of one job.
	MaxDeps = 4096
	// MaxErrorMessage bounds Error.Message in bytes.
	MaxErrorMessage = 1024
	// MaxExtentHashes is the largest extent whose hashes fit one frame
	// (131072 blocks: a 64 MiB extent of 512-byte blocks).
	MaxExtentHashes = MaxDataSize / 8
	// MaxExtentVersions is the most extent versions one frame carries.
	MaxExtentVersions = MaxDataSize / extentVersionSize
	// MaxRepairBlocks bounds the block list of RepairRead, RepairData and
	// RepairWrite.
	MaxRepairBlocks = 4096
)

// Encoded sizes of fixed parts.
const (
	uuidSize          = 16
	extentVersionSize = 8 + 8 + 1
	regionInfoSize    = uuidSize + 4 + 4 + 4
	// maxBulkHashes bounds the hashes of a Write or ReadResponse: a generous
	// bound (one per 8 data bytes) that only has to keep frames finite.
	maxBulkHashes = MaxDataSize / 8
)
