package wire

import (
	"fmt"
	"tern/volume/ids"

	"github.com/google/uuid"
)

// cursor reads little-endian fields from a payload. Reading past the end
// marks it bad instead of panicking; callers check bad once at the end.
type cursor struct {
	b   []byte
	bad bool
}

func (c *cursor) take(n int) []byte {
	if c.bad || n < 0 || len(c.b) < n {
		c.bad = true
		return nil
	}
	p := c.b[:n]
	c.b = c.b[n:]
	return p
}

func (c *cursor) u16() uint16 {
	if p := c.take(2); p != nil {
		return le.Uint16(p)
	}
	return 0
}

func (c *cursor) u32() uint32 {
	if p := c.take(4); p != nil {
		return le.Uint32(p)
	}
	return 0
}

func (c *cursor) u64() uint64 {
	if p := c.take(8); p != nil {
		return le.Uint64(p)
	}
	return 0
}

// boolean accepts only 0 and 1 so every payload has one encoding.
func (c *cursor) boolean() bool {
	p := c.take(1)
	if p == nil {
		return false
	}
	if p[0] > 1 {
		c.bad = true
	}
	return p[0] == 1
}

func (c *cursor) uuid() uuid.UUID {
	if p := c.take(uuidSize); p != nil {
		return uuidOf(p)
	}
	return uuid.UUID{}
}

func (c *cursor) region() RegionInfo {
	return RegionInfo{UUID: c.uuid(), BlockSize: c.u32(), ExtentBlocks: c.u32(), ExtentCount: c.u32()}
}

func (c *cursor) version() ExtentVersion {
	return ExtentVersion{Gen: ids.Generation(c.u64()), Flush: c.u64(), Dirty: c.boolean()}
}

// fits reports whether n elements of size bytes remain, without overflow.
func (c *cursor) fits(n uint32, size int) bool {
	if c.bad || uint64(n)*uint64(size) > uint64(len(c.b)) {
		c.bad = true
		return false
	}
	return true
}

func (c *cursor) jobs(dst []JobID, n uint32) []JobID {
	dst = dst[:0]
	if !c.fits(n, 8) {
		return dst
	}
	for range n {
		dst = append(dst, JobID(c.u64()))
	}
	return dst
}

func (c *cursor) u64s(dst []uint64, n uint32) []uint64 {
	dst = dst[:0]
	if !c.fits(n, 8) {
		return dst
	}
	for range n {
		dst = append(dst, c.u64())
	}
	return dst
}

func (c *cursor) u32s(dst []uint32, n uint32) []uint32 {
	dst = dst[:0]
	if !c.fits(n, 4) {
		return dst
	}
	for range n {
		dst = append(dst, c.u32())
	}
	return dst
}

// parse decodes the non-data part of a payload into the Decoder's reused
// message of type t. Bulk data is attached by the caller.
func (d *Decoder) parse(t MsgType, p []byte) (Message, error) {
	c := &cursor{b: p}
	var m Message
	switch t {
	case TypeHello:
		h := &d.hello
		n := c.u16()
		if n == 0 || n > MaxVersions || !c.fits(uint32(n), 4) {
			return nil, fmt.Errorf("%d versions: %w", n, ErrMalformed)
		}
		d.versions = d.versions[:0]
		for range n {
			d.versions = append(d.versions, ProtocolVersion(c.u32()))
		}
		h.Versions = d.versions
		h.RegionUUID = c.uuid()
		h.ReadOnly = c.boolean()
		h.UpstairsID = c.uuid()
		h.SessionID = c.uuid()
		m = h
	case TypeHelloReply:
		d.helloReply = HelloReply{Version: ProtocolVersion(c.u32()), Region: c.region()}
		m = &d.helloReply
	case TypeError:
		e := &d.errMsg
		e.JobID = JobID(c.u64())
		e.Code = ErrorCode(c.u16())
		n := c.u16()
		if n > MaxErrorMessage {
			return nil, fmt.Errorf("%d byte message: %w", n, ErrMalformed)
		}
		e.Message = string(c.take(int(n)))
		m = e
	case TypeActivate:
		d.activate = Activate{JobID: JobID(c.u64()), UpstairsID: c.uuid(), SessionID: c.uuid(), Gen: ids.Generation(c.u64())}
		m = &d.activate
	case TypeActivateAck:
		d.activateAck = ActivateAck{JobID: JobID(c.u64()), Gen: ids.Generation(c.u64()), LostWrites: c.boolean()}
		m = &d.activateAck
	case TypeFenced:
		d.fenced = Fenced{JobID: JobID(c.u64()), ByGen: ids.Generation(c.u64()), ByUpstairs: c.uuid()}
		m = &d.fenced
	case TypeRegionInfoRequest:
		d.regionReq = RegionInfoRequest{JobID: JobID(c.u64())}
		m = &d.regionReq
	case TypeRegionInfoReply:
		d.regionReply = RegionInfoReply{JobID: JobID(c.u64()), Region: c.region()}
		m = &d.regionReply
	case TypeExtentVersionsRequest:
		d.versionsReq = ExtentVersionsRequest{JobID: JobID(c.u64()), First: ids.ExtentID(c.u32()), Count: c.u32()}
		m = &d.versionsReq
	case TypeExtentVersions:
		v := &d.extentVersions
		v.JobID = JobID(c.u64())
		v.First = ids.ExtentID(c.u32())
		n := c.u32()
		d.extents = d.extents[:0]
		if n > MaxExtentVersions || !c.fits(n, extentVersionSize) {
			return nil, fmt.Errorf("%d versions: %w", n, ErrMalformed)
		}
		for range n {
			d.extents = append(d.extents, c.version())
		}
		v.Versions = d.extents
		m = v
	case TypeWrite:
		w := &d.write
		w.JobID = JobID(c.u64())
		w.Offset = ids.BlockIndex(c.u64())
		nDeps, nHashes := c.u32(), c.u32()
		c.u32() // data length, checked by nextBulk
		d.deps = c.jobs(d.deps, nDeps)
		d.hashes = c.u64s(d.hashes, nHashes)
		w.Deps, w.Hashes, w.Data = d.deps, d.hashes, nil
		m = w
	case TypeRead:
		r := &d.read
		r.JobID = JobID(c.u64())
		r.Offset = ids.BlockIndex(c.u64())
		r.Count = c.u32()
		d.deps = c.jobs(d.deps, c.u32())
		r.Deps = d.deps
		m = r
	case TypeReadResponse:
		r := &d.readResp
		r.JobID = JobID(c.u64())
		nHashes := c.u32()
		c.u32()
		d.hashes = c.u64s(d.hashes, nHashes)
		r.Hashes, r.Data = d.hashes, nil
		m = r
	case TypeFlush:
		f := &d.flush
		f.JobID = JobID(c.u64())
		f.FlushNumber = c.u64()
		f.Gen = ids.Generation(c.u64())
		d.deps = c.jobs(d.deps, c.u32())
		f.Deps = d.deps
		m = f
	case TypeAck:
		d.ack = Ack{JobID: JobID(c.u64())}
		m = &d.ack
	case TypeExtentHashesRequest:
		d.hashesReq = ExtentHashesRequest{JobID: JobID(c.u64()), Extent: ids.ExtentID(c.u32())}
		m = &d.hashesReq
	case TypeExtentHashes:
		h := &d.extentHashes
		h.JobID = JobID(c.u64())
		h.Extent = ids.ExtentID(c.u32())
		h.Version = c.version()
		n := c.u32()
		if n > MaxExtentHashes {
			return nil, fmt.Errorf("%d hashes: %w", n, ErrMalformed)
		}
		d.hashes = c.u64s(d.hashes, n)
		h.Hashes = d.hashes
		m = h
	case TypeRepairRead:
		r := &d.repairRead
		r.JobID = JobID(c.u64())
		r.Extent = ids.ExtentID(c.u32())
		n := c.u32()
		if n > MaxRepairBlocks {
			return nil, fmt.Errorf("%d blocks: %w", n, ErrMalformed)
		}
		d.blocks = c.u32s(d.blocks, n)
		r.Blocks = d.blocks
		if err := checkBlockList(r.Blocks); err != nil {
			return nil, err
		}
		m = r
	case TypeRepairData:
		r := &d.repairData
		r.JobID = JobID(c.u64())
		r.Extent = ids.ExtentID(c.u32())
		n := c.u32()
		c.u32()
		d.blocks = c.u32s(d.blocks, n)
		d.hashes = c.u64s(d.hashes, n)
		r.Blocks, r.Hashes, r.Data = d.blocks, d.hashes, nil
		if err := checkBlockList(r.Blocks); err != nil {
			return nil, err
		}
		m = r
	case TypeRepairWrite:
		r := &d.repairWrite
		r.JobID = JobID(c.u64())
		r.Extent = ids.ExtentID(c.u32())
		r.Version = c.version()
		n := c.u32()
		c.u32()
		d.blocks = c.u32s(d.blocks, n)
		d.hashes = c.u64s(d.hashes, n)
		r.Blocks, r.Hashes, r.Data = d.blocks, d.hashes, nil
		if err := checkBlockList(r.Blocks); err != nil {
			return nil, err
		}
		m = r
	default:
		return nil, fmt.Errorf("type %d: %w", uint16(t), ErrUnknownType)
	}
	if c.bad {
		return nil, fmt.Errorf("truncated payload: %w", ErrMalformed)
	}
	if len(c.b) != 0 {
		return nil, fmt.Errorf("%d trailing bytes: %w", len(c.b), ErrMalformed)
	}
	return m, nil
}

// checkBlockList enforces the one shape of a repair block list: strictly
// increasing. A list with a duplicate or out of order would make the
// result depend on which copy of a block is applied last, and no upstairs
// sends one. (Whether the blocks lie inside the extent depends on the
// region, which only the receiver knows.)
func checkBlockList(blocks []uint32) error {
	for i := 1; i < len(blocks); i++ {
		if blocks[i] <= blocks[i-1] {
			return fmt.Errorf("block %d after block %d: %w", blocks[i], blocks[i-1], ErrMalformed)
		}
	}
	return nil
}
