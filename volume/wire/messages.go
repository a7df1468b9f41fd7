package wire

import (
	"fmt"
	"tern/volume/ids"

	"github.com/google/uuid"
)

// MsgType identifies the kind of message in a frame header.
type MsgType uint16

// Message types. The numbers are part of the protocol and never reused.
const (
	TypeHello                 MsgType = 1
	TypeHelloReply            MsgType = 2
	TypeError                 MsgType = 3
	TypeActivate              MsgType = 4
	TypeActivateAck           MsgType = 5
	TypeFenced                MsgType = 6
	TypeRegionInfoRequest     MsgType = 7
	TypeRegionInfoReply       MsgType = 8
	TypeExtentVersionsRequest MsgType = 9
	TypeExtentVersions        MsgType = 10
	TypeWrite                 MsgType = 11
	TypeRead                  MsgType = 12
	TypeReadResponse          MsgType = 13
	TypeFlush                 MsgType = 14
	TypeAck                   MsgType = 15
	TypeExtentHashesRequest   MsgType = 16
	TypeExtentHashes          MsgType = 17
	TypeRepairRead            MsgType = 18
	TypeRepairData            MsgType = 19
	TypeRepairWrite           MsgType = 20

	typeLimit = 21 // one past the highest type
)

var typeNames = [typeLimit]string{
	TypeHello:                 "Hello",
	TypeHelloReply:            "HelloReply",
	TypeError:                 "Error",
	TypeActivate:              "Activate",
	TypeActivateAck:           "ActivateAck",
	TypeFenced:                "Fenced",
	TypeRegionInfoRequest:     "RegionInfoRequest",
	TypeRegionInfoReply:       "RegionInfoReply",
	TypeExtentVersionsRequest: "ExtentVersionsRequest",
	TypeExtentVersions:        "ExtentVersions",
	TypeWrite:                 "Write",
	TypeRead:                  "Read",
	TypeReadResponse:          "ReadResponse",
	TypeFlush:                 "Flush",
	TypeAck:                   "Ack",
	TypeExtentHashesRequest:   "ExtentHashesRequest",
	TypeExtentHashes:          "ExtentHashes",
	TypeRepairRead:            "RepairRead",
	TypeRepairData:            "RepairData",
	TypeRepairWrite:           "RepairWrite",
}

// String returns the message type's name.
func (t MsgType) String() string {
	if t < typeLimit && typeNames[t] != "" {
		return typeNames[t]
	}
	return fmt.Sprintf("MsgType(%d)", uint16(t))
}

// Valid reports whether t is a message type of this protocol.
func (t MsgType) Valid() bool { return t < typeLimit && typeNames[t] != "" }

// HasData reports whether messages of type t end in bulk block data.
func (t MsgType) HasData() bool {
	switch t {
	case TypeWrite, TypeReadResponse, TypeRepairData, TypeRepairWrite:
		return true
	}
	return false
}

// Message is one protocol message. Only pointers to the message structs of
// this package implement it.
type Message interface {
	// Type returns the message's MsgType.
	Type() MsgType
}

// JobOf returns the JobID a message carries, or false for Hello and
// HelloReply, which carry none.
func JobOf(m Message) (JobID, bool) {
	switch m := m.(type) {
	case *Error:
		return m.JobID, true
	case *Activate:
		return m.JobID, true
	case *ActivateAck:
		return m.JobID, true
	case *Fenced:
		return m.JobID, true
	case *RegionInfoRequest:
		return m.JobID, true
	case *RegionInfoReply:
		return m.JobID, true
	case *ExtentVersionsRequest:
		return m.JobID, true
	case *ExtentVersions:
		return m.JobID, true
	case *Write:
		return m.JobID, true
	case *Read:
		return m.JobID, true
	case *ReadResponse:
		return m.JobID, true
	case *Flush:
		return m.JobID, true
	case *Ack:
		return m.JobID, true
	case *ExtentHashesRequest:
		return m.JobID, true
	case *ExtentHashes:
		return m.JobID, true
	case *RepairRead:
		return m.JobID, true
	case *RepairData:
		return m.JobID, true
	case *RepairWrite:
		return m.JobID, true
	}
	return 0, false
}

// SetJobID stamps a request a client sends by job id (IO, flush,
// extent versions and hashes, repair reads and writes, region info) with
// id, and returns false for any other message. The replicated upstairs
// and the erasure-coded volume both number their calls with it.
func SetJobID(m Message, id JobID) bool {
	switch m := m.(type) {
	case *RegionInfoRequest:
		m.JobID = id
	case *ExtentVersionsRequest:
		m.JobID = id
	case *Write:
		m.JobID = id
	case *Read:
		m.JobID = id
	case *Flush:
		m.JobID = id
	case *ExtentHashesRequest:
		m.JobID = id
	case *RepairRead:
		m.JobID = id
	case *RepairWrite:
		m.JobID = id
	default:
		return false
	}
	return true
}

// Hello opens a session: the client's versions and identity.
type Hello struct {
	// Versions lists every protocol version the client speaks (1 to
	// MaxVersions entries).
	Versions []ProtocolVersion
	// RegionUUID is the region the client expects; the zero UUID accepts any.
	RegionUUID uuid.UUID
	// ReadOnly asks for a session that never writes and never fences.
	ReadOnly bool
	// UpstairsID identifies the upstairs instance.
	UpstairsID uuid.UUID
	// SessionID identifies this connection of the upstairs.
	SessionID uuid.UUID
}

// HelloReply accepts a session.
type HelloReply struct {
	// Version is the protocol version chosen for the session.
	Version ProtocolVersion
	// Region is the geometry of the served region.
	Region RegionInfo
}

// Error reports that a request failed, or with JobID zero that the session
// failed (version or region mismatch).
type Error struct {
	// JobID is the request that failed, zero for a session-level error.
	JobID JobID
	// Code says what failed; callers branch on it.
	Code ErrorCode
	// Message is a human-readable detail, at most MaxErrorMessage bytes.
	Message string
}

// Err returns the error as a Go error that matches Code with errors.Is.
func (m *Error) Err() error { return &RemoteError{Code: m.Code, Message: m.Message} }

// Activate asks the downstairs to make this session the region's writer.
type Activate struct {
	JobID JobID
	// UpstairsID and SessionID repeat the Hello's identity.
	UpstairsID uuid.UUID
	SessionID  uuid.UUID
	// Gen must exceed every generation the downstairs has accepted before.
	Gen ids.Generation
}

// ActivateAck confirms an activation; Gen is stored durably.
type ActivateAck struct {
	JobID JobID
	Gen   ids.Generation
	// LostWrites: the region was opened after a crash with extents
	// written since their last flush, and has not been flushed since, so
	// writes it acknowledged before the crash may be gone. An upstairs
	// rejoining at the generation it holds must not replay its backlog
	// over such a replica: it repairs it instead.
	LostWrites bool
}

// Fenced tells a session it is no longer active because another upstairs
// activated with a higher generation. It answers any request of a fenced
// session, and is also sent unprompted with JobID zero at the takeover.
type Fenced struct {
	JobID JobID
	// ByGen is the generation that took over.
	ByGen ids.Generation
	// ByUpstairs is the upstairs that took over.
	ByUpstairs uuid.UUID
}

// RegionInfoRequest asks for the region geometry.
type RegionInfoRequest struct {
	JobID JobID
}

// RegionInfoReply answers RegionInfoRequest.
type RegionInfoReply struct {
	JobID  JobID
	Region RegionInfo
}

// ExtentVersionsRequest asks for the versions of Count extents starting at
// First. Count zero asks for as many as fit one frame (MaxExtentVersions).
type ExtentVersionsRequest struct {
	JobID JobID
	First ids.ExtentID
	Count uint32
}

// ExtentVersions answers ExtentVersionsRequest: Versions[i] belongs to
// extent First+i. It may hold fewer extents than asked for when the region
// ends or the frame is full.
type ExtentVersions struct {
	JobID    JobID
	First    ids.ExtentID
	Versions []ExtentVersion
}

// Write stores len(Hashes) blocks starting at Offset. Hashes[i] is the
// xxhash64 of block i of Data; a downstairs rejects data that does not match.
type Write struct {
	JobID JobID
	// Deps are jobs that must complete before this one runs.
	Deps   []JobID
	Offset ids.BlockIndex
	Hashes []uint64
	// Data is len(Hashes) blocks.
	Data []byte
}

// Read asks for Count blocks starting at Offset.
type Read struct {
	JobID  JobID
	Deps   []JobID
	Offset ids.BlockIndex
	Count  uint32
}

// ReadResponse answers Read with the blocks and their recorded hashes.
type ReadResponse struct {
	JobID  JobID
	Hashes []uint64
	Data   []byte
}

// Flush makes every earlier write durable and stamps dirty extents with
// FlushNumber and Gen.
type Flush struct {
	JobID       JobID
	Deps        []JobID
	FlushNumber uint64
	Gen         ids.Generation
}

// Ack completes a Write, Flush or RepairWrite.
type Ack struct {
	JobID JobID
}

// ExtentHashesRequest asks for an extent's version and per-block hashes.
type ExtentHashesRequest struct {
	JobID  JobID
	Extent ids.ExtentID
}

// ExtentHashes answers ExtentHashesRequest: Hashes[i] is block i's recorded
// hash (zero for a block never written).
type ExtentHashes struct {
	JobID   JobID
	Extent  ids.ExtentID
	Version ExtentVersion
	Hashes  []uint64
}

// RepairRead asks for some blocks of one extent, by index within the
// extent, strictly increasing.
type RepairRead struct {
	JobID  JobID
	Extent ids.ExtentID
	Blocks []uint32
}

// RepairData answers RepairRead: Blocks[i] has hash Hashes[i] and data
// block i of Data.
type RepairData struct {
	JobID  JobID
	Extent ids.ExtentID
	Blocks []uint32
	Hashes []uint64
	Data   []byte
}

// RepairWrite overwrites some blocks of one extent (strictly increasing)
// with a peer's copy and sets the extent's version to Version, making it
// match the source.
type RepairWrite struct {
	JobID   JobID
	Extent  ids.ExtentID
	Version ExtentVersion
	Blocks  []uint32
	Hashes  []uint64
	Data    []byte
}

// Type implements Message.
func (*Hello) Type() MsgType { return TypeHello }

// Type implements Message.
func (*HelloReply) Type() MsgType { return TypeHelloReply }

// Type implements Message.
func (*Error) Type() MsgType { return TypeError }

// Type implements Message.
func (*Activate) Type() MsgType { return TypeActivate }

// Type implements Message.
func (*ActivateAck) Type() MsgType { return TypeActivateAck }

// Type implements Message.
func (*Fenced) Type() MsgType { return TypeFenced }

// Type implements Message.
func (*RegionInfoRequest) Type() MsgType { return TypeRegionInfoRequest }

// Type implements Message.
func (*RegionInfoReply) Type() MsgType { return TypeRegionInfoReply }

// Type implements Message.
func (*ExtentVersionsRequest) Type() MsgType { return TypeExtentVersionsRequest }

// Type implements Message.
func (*ExtentVersions) Type() MsgType { return TypeExtentVersions }

// Type implements Message.
func (*Write) Type() MsgType { return TypeWrite }

// Type implements Message.
func (*Read) Type() MsgType { return TypeRead }

// Type implements Message.
func (*ReadResponse) Type() MsgType { return TypeReadResponse }

// Type implements Message.
func (*Flush) Type() MsgType { return TypeFlush }

// Type implements Message.
func (*Ack) Type() MsgType { return TypeAck }

// Type implements Message.
func (*ExtentHashesRequest) Type() MsgType { return TypeExtentHashesRequest }

// Type implements Message.
func (*ExtentHashes) Type() MsgType { return TypeExtentHashes }

// Type implements Message.
func (*RepairRead) Type() MsgType { return TypeRepairRead }

// Type implements Message.
func (*RepairData) Type() MsgType { return TypeRepairData }

// Type implements Message.
func (*RepairWrite) Type() MsgType { return TypeRepairWrite }
