package wire

import (
	"encoding/binary"
	"fmt"
	"io"

	"github.com/google/uuid"
)

var le = binary.LittleEndian

// Encoder writes frames to an io.Writer. It is not safe for concurrent use:
// one goroutine owns each Encoder (and the stream under it).
type Encoder struct {
	w   io.Writer
	buf []byte // header, fixed fields and small arrays of the frame being written
}

// NewEncoder returns an Encoder writing to w.
func NewEncoder(w io.Writer) *Encoder {
	return &Encoder{w: w, buf: make([]byte, 0, 4096)}
}

// Encode writes m as one frame. The header, fixed fields and small arrays
// go out in one Write from a reused buffer; bulk data, if any, goes out in a
// second Write straight from m's slice, never copied.
func (e *Encoder) Encode(m Message) error {
	buf, data, err := AppendFrame(e.buf[:0], m)
	if err != nil {
		return err
	}
	e.buf = buf
	if _, err := e.w.Write(buf); err != nil {
		return fmt.Errorf("writing %v frame: %w", m.Type(), err)
	}
	if len(data) > 0 {
		if _, err := e.w.Write(data); err != nil {
			return fmt.Errorf("writing %v data: %w", m.Type(), err)
		}
	}
	return nil
}

// AppendFrame appends m's frame to dst, except for its bulk data, which it
// returns separately: the complete frame is the returned buffer followed by
// data. It fails with ErrTooLarge if m exceeds a protocol limit.
func AppendFrame(dst []byte, m Message) (frame, data []byte, err error) {
	start := len(dst)
	dst = append(dst, 0, 0, 0, 0, 0, 0, 0, 0)
	dst, data, err = appendPayload(dst, m)
	if err != nil {
		return dst[:start], nil, fmt.Errorf("encoding %v: %w", m.Type(), err)
	}
	payload := len(dst) - start - HeaderSize + len(data)
	if payload > MaxPayload {
		return dst[:start], nil, fmt.Errorf("encoding %v: %d byte payload: %w", m.Type(), payload, ErrTooLarge)
	}
	h := dst[start:]
	le.PutUint16(h[0:], FrameMagic)
	le.PutUint16(h[2:], uint16(m.Type()))
	le.PutUint32(h[4:], uint32(payload))
	return dst, data, nil
}

func appendPayload(b []byte, m Message) ([]byte, []byte, error) {
	switch m := m.(type) {
	case *Hello:
		if len(m.Versions) == 0 || len(m.Versions) > MaxVersions {
			return b, nil, fmt.Errorf("%d versions: %w", len(m.Versions), ErrTooLarge)
		}
		b = le.AppendUint16(b, uint16(len(m.Versions)))
		for _, v := range m.Versions {
			b = le.AppendUint32(b, uint32(v))
		}
		b = append(b, m.RegionUUID[:]...)
		b = appendBool(b, m.ReadOnly)
		b = append(b, m.UpstairsID[:]...)
		b = append(b, m.SessionID[:]...)
	case *HelloReply:
		b = le.AppendUint32(b, uint32(m.Version))
		b = appendRegion(b, m.Region)
	case *Error:
		msg := m.Message
		if len(msg) > MaxErrorMessage {
			msg = msg[:MaxErrorMessage]
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint16(b, uint16(m.Code))
		b = le.AppendUint16(b, uint16(len(msg)))
		b = append(b, msg...)
	case *Activate:
		b = le.AppendUint64(b, uint64(m.JobID))
		b = append(b, m.UpstairsID[:]...)
		b = append(b, m.SessionID[:]...)
		b = le.AppendUint64(b, uint64(m.Gen))
	case *ActivateAck:
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint64(b, uint64(m.Gen))
		b = appendBool(b, m.LostWrites)
	case *Fenced:
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint64(b, uint64(m.ByGen))
		b = append(b, m.ByUpstairs[:]...)
	case *RegionInfoRequest:
		b = le.AppendUint64(b, uint64(m.JobID))
	case *RegionInfoReply:
		b = le.AppendUint64(b, uint64(m.JobID))
		b = appendRegion(b, m.Region)
	case *ExtentVersionsRequest:
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint32(b, uint32(m.First))
		b = le.AppendUint32(b, m.Count)
	case *ExtentVersions:
		if len(m.Versions) > MaxExtentVersions {
			return b, nil, fmt.Errorf("%d versions: %w", len(m.Versions), ErrTooLarge)
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint32(b, uint32(m.First))
		b = le.AppendUint32(b, uint32(len(m.Versions)))
		for _, v := range m.Versions {
			b = appendVersion(b, v)
		}
	case *Write:
		if err := checkBulk(len(m.Deps), len(m.Hashes), len(m.Data)); err != nil {
			return b, nil, err
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint64(b, uint64(m.Offset))
		b = le.AppendUint32(b, uint32(len(m.Deps)))
		b = le.AppendUint32(b, uint32(len(m.Hashes)))
		b = le.AppendUint32(b, uint32(len(m.Data)))
		b = appendJobs(b, m.Deps)
		b = appendU64s(b, m.Hashes)
		return b, m.Data, nil
	case *Read:
		if len(m.Deps) > MaxDeps {
			return b, nil, fmt.Errorf("%d deps: %w", len(m.Deps), ErrTooLarge)
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint64(b, uint64(m.Offset))
		b = le.AppendUint32(b, m.Count)
		b = le.AppendUint32(b, uint32(len(m.Deps)))
		b = appendJobs(b, m.Deps)
	case *ReadResponse:
		if err := checkBulk(0, len(m.Hashes), len(m.Data)); err != nil {
			return b, nil, err
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint32(b, uint32(len(m.Hashes)))
		b = le.AppendUint32(b, uint32(len(m.Data)))
		b = appendU64s(b, m.Hashes)
		return b, m.Data, nil
	case *Flush:
		if len(m.Deps) > MaxDeps {
			return b, nil, fmt.Errorf("%d deps: %w", len(m.Deps), ErrTooLarge)
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint64(b, m.FlushNumber)
		b = le.AppendUint64(b, uint64(m.Gen))
		b = le.AppendUint32(b, uint32(len(m.Deps)))
		b = appendJobs(b, m.Deps)
	case *Ack:
		b = le.AppendUint64(b, uint64(m.JobID))
	case *ExtentHashesRequest:
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint32(b, uint32(m.Extent))
	case *ExtentHashes:
		if len(m.Hashes) > MaxExtentHashes {
			return b, nil, fmt.Errorf("%d hashes: %w", len(m.Hashes), ErrTooLarge)
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint32(b, uint32(m.Extent))
		b = appendVersion(b, m.Version)
		b = le.AppendUint32(b, uint32(len(m.Hashes)))
		b = appendU64s(b, m.Hashes)
	case *RepairRead:
		if len(m.Blocks) > MaxRepairBlocks {
			return b, nil, fmt.Errorf("%d blocks: %w", len(m.Blocks), ErrTooLarge)
		}
		if err := checkBlockList(m.Blocks); err != nil {
			return b, nil, err
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint32(b, uint32(m.Extent))
		b = le.AppendUint32(b, uint32(len(m.Blocks)))
		b = appendU32s(b, m.Blocks)
	case *RepairData:
		if err := checkRepair(m.Blocks, len(m.Hashes), len(m.Data)); err != nil {
			return b, nil, err
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint32(b, uint32(m.Extent))
		b = le.AppendUint32(b, uint32(len(m.Blocks)))
		b = le.AppendUint32(b, uint32(len(m.Data)))
		b = appendU32s(b, m.Blocks)
		b = appendU64s(b, m.Hashes)
		return b, m.Data, nil
	case *RepairWrite:
		if err := checkRepair(m.Blocks, len(m.Hashes), len(m.Data)); err != nil {
			return b, nil, err
		}
		b = le.AppendUint64(b, uint64(m.JobID))
		b = le.AppendUint32(b, uint32(m.Extent))
		b = appendVersion(b, m.Version)
		b = le.AppendUint32(b, uint32(len(m.Blocks)))
		b = le.AppendUint32(b, uint32(len(m.Data)))
		b = appendU32s(b, m.Blocks)
		b = appendU64s(b, m.Hashes)
		return b, m.Data, nil
	default:
		return b, nil, fmt.Errorf("message %T: %w", m, ErrUnknownType)
	}
	return b, nil, nil
}

func checkBulk(deps, hashes, data int) error {
	switch {
	case deps > MaxDeps:
		return fmt.Errorf("%d deps: %w", deps, ErrTooLarge)
	case data > MaxDataSize:
		return fmt.Errorf("%d data bytes: %w", data, ErrTooLarge)
	case hashes > maxBulkHashes:
		return fmt.Errorf("%d hashes: %w", hashes, ErrTooLarge)
	}
	return nil
}

func checkRepair(blocks []uint32, hashes, data int) error {
	switch {
	case len(blocks) > MaxRepairBlocks:
		return fmt.Errorf("%d blocks: %w", len(blocks), ErrTooLarge)
	case hashes != len(blocks):
		return fmt.Errorf("%d hashes for %d blocks: %w", hashes, len(blocks), ErrMalformed)
	case data > MaxDataSize:
		return fmt.Errorf("%d data bytes: %w", data, ErrTooLarge)
	}
	return checkBlockList(blocks)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func appendRegion(b []byte, r RegionInfo) []byte {
	b = append(b, r.UUID[:]...)
	b = le.AppendUint32(b, r.BlockSize)
	b = le.AppendUint32(b, r.ExtentBlocks)
	return le.AppendUint32(b, r.ExtentCount)
}

func appendVersion(b []byte, v ExtentVersion) []byte {
	b = le.AppendUint64(b, uint64(v.Gen))
	b = le.AppendUint64(b, v.Flush)
	return appendBool(b, v.Dirty)
}

func appendJobs(b []byte, ids []JobID) []byte {
	for _, id := range ids {
		b = le.AppendUint64(b, uint64(id))
	}
	return b
}

func appendU64s(b []byte, vs []uint64) []byte {
	for _, v := range vs {
		b = le.AppendUint64(b, v)
	}
	return b
}

func appendU32s(b []byte, vs []uint32) []byte {
	for _, v := range vs {
		b = le.AppendUint32(b, v)
	}
	return b
}

// uuidOf is a helper so decoders read a UUID without a library call that
// could fail.
func uuidOf(b []byte) (u uuid.UUID) {
	copy(u[:], b)
	return u
}
