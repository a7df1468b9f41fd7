package downstairs

import (
	"tern/volume/extent"
	"tern/volume/wire"
)

// toJob turns a decoded request into a job, copying what it needs out of
// the decoder's storage. data is the pooled buffer the decoder filled for a
// Write or RepairWrite (nil otherwise); the job takes it over. A request
// that cannot be valid becomes a failed job whose reply is an Error.
func (s *session) toJob(m wire.Message, data *[]byte) *job {
	spec := s.srv.spec
	bs := uint64(spec.BlockSize)
	var j *job
	switch m := m.(type) {
	case *wire.Write:
		j = newJob(s, kindWrite, m.JobID, m.Deps)
		j.offset = m.Offset
		j.hashes = append(j.hashes[:0], m.Hashes...)
		j.buf, data = data, nil
		if len(m.Hashes) == 0 || uint64(len(m.Data)) != uint64(len(m.Hashes))*bs {
			j.fail(wire.CodeBadRequest, "%d data bytes for %d blocks of %d", len(m.Data), len(m.Hashes), bs)
		} else if !inRegion(spec, uint64(m.Offset), uint64(len(m.Hashes))) {
			j.fail(wire.CodeOutOfRange, "blocks [%d, +%d) past the region's %d", m.Offset, len(m.Hashes), spec.Blocks())
		}
	case *wire.Read:
		j = newJob(s, kindRead, m.JobID, m.Deps)
		j.offset, j.count = m.Offset, m.Count
		if m.Count == 0 || uint64(m.Count)*bs > wire.MaxDataSize {
			j.fail(wire.CodeBadRequest, "read of %d blocks (at most %d bytes)", m.Count, wire.MaxDataSize)
		} else if !inRegion(spec, uint64(m.Offset), uint64(m.Count)) {
			j.fail(wire.CodeOutOfRange, "blocks [%d, +%d) past the region's %d", m.Offset, m.Count, spec.Blocks())
		}
	case *wire.Flush:
		j = newJob(s, kindFlush, m.JobID, m.Deps)
		j.flushNumber, j.gen = m.FlushNumber, m.Gen
	case *wire.ExtentVersionsRequest:
		j = newJob(s, kindExtentVersions, m.JobID, nil)
		j.extent, j.count = m.First, m.Count
	case *wire.ExtentHashesRequest:
		j = newJob(s, kindExtentHashes, m.JobID, nil)
		j.extent = m.Extent
		if spec.ExtentBlocks > wire.MaxExtentHashes {
			j.fail(wire.CodeBadRequest, "extent of %d blocks has more hashes than a frame holds", spec.ExtentBlocks)
		}
	case *wire.RepairRead:
		j = newJob(s, kindRepairRead, m.JobID, nil)
		j.extent = m.Extent
		j.blocks = append(j.blocks[:0], m.Blocks...)
		if len(m.Blocks) == 0 || uint64(len(m.Blocks))*bs > wire.MaxDataSize {
			j.fail(wire.CodeBadRequest, "repair read of %d blocks (at most %d bytes)", len(m.Blocks), wire.MaxDataSize)
		}
	case *wire.RepairWrite:
		j = newJob(s, kindRepairWrite, m.JobID, nil)
		j.extent, j.version = m.Extent, m.Version
		j.blocks = append(j.blocks[:0], m.Blocks...)
		j.hashes = append(j.hashes[:0], m.Hashes...)
		j.buf, data = data, nil
		if uint64(len(m.Data)) != uint64(len(m.Blocks))*bs {
			j.fail(wire.CodeBadRequest, "%d data bytes for %d blocks of %d", len(m.Data), len(m.Blocks), bs)
		}
	case *wire.Activate:
		j = newJob(s, kindActivate, m.JobID, nil)
		j.gen, j.upstairs = m.Gen, m.UpstairsID
		if m.UpstairsID != s.upstairs || m.SessionID != s.sessionID {
			j.fail(wire.CodeBadRequest, "activation for upstairs %v session %v on a session of %v/%v", m.UpstairsID, m.SessionID, s.upstairs, s.sessionID)
		} else if m.Gen == 0 {
			j.fail(wire.CodeGenTooLow, "generation 0: generations start at 1")
		}
	case *wire.RegionInfoRequest:
		j = newJob(s, kindRegionInfo, m.JobID, nil)
	default:
		id, _ := wire.JobOf(m)
		j = newJob(s, kindInvalid, id, nil)
		j.fail(wire.CodeBadRequest, "%v is not a request", m.Type())
	}
	s.srv.bufs.put(data)
	return j
}

// inRegion reports whether n blocks from first lie inside the region.
func inRegion(spec extent.Spec, first, n uint64) bool {
	total := spec.Blocks()
	return first <= total && n <= total-first
}

// replyEncoder holds one reusable message of each reply type, so encoding
// a reply allocates nothing.
type replyEncoder struct {
	errMsg   wire.Error
	fenced   wire.Fenced
	ack      wire.Ack
	actAck   wire.ActivateAck
	region   wire.RegionInfoReply
	readResp wire.ReadResponse
	versions wire.ExtentVersions
	hashes   wire.ExtentHashes
	repair   wire.RepairData
}

// encode writes j's reply.
func (r *replyEncoder) encode(enc *wire.Encoder, j *job, spec extent.Spec) error {
	var m wire.Message
	switch {
	case j.fenced != nil:
		r.fenced = wire.Fenced{JobID: j.id, ByGen: j.fenced.gen, ByUpstairs: j.fenced.by}
		m = &r.fenced
	case j.failed:
		r.errMsg = wire.Error{JobID: j.id, Code: j.code, Message: j.errMsg}
		m = &r.errMsg
	default:
		switch j.kind {
		case kindWrite, kindFlush, kindRepairWrite:
			r.ack.JobID = j.id
			m = &r.ack
		case kindActivate:
			r.actAck = wire.ActivateAck{JobID: j.id, Gen: j.gen, LostWrites: j.lostWrites}
			m = &r.actAck
		case kindRegionInfo:
			r.region = wire.RegionInfoReply{JobID: j.id, Region: regionInfoOf(spec)}
			m = &r.region
		case kindRead:
			r.readResp = wire.ReadResponse{JobID: j.id, Hashes: j.hashes, Data: j.data()}
			m = &r.readResp
		case kindExtentVersions:
			r.versions = wire.ExtentVersions{JobID: j.id, First: j.extent, Versions: j.versions}
			m = &r.versions
		case kindExtentHashes:
			r.hashes = wire.ExtentHashes{JobID: j.id, Extent: j.extent, Version: j.version, Hashes: j.hashes}
			m = &r.hashes
		case kindRepairRead:
			r.repair = wire.RepairData{JobID: j.id, Extent: j.extent, Blocks: j.blocks, Hashes: j.hashes, Data: j.data()}
			m = &r.repair
		default:
			return nil
		}
	}
	return enc.Encode(m)
}

func regionInfoOf(spec extent.Spec) wire.RegionInfo {
	return wire.RegionInfo{UUID: spec.UUID, BlockSize: spec.BlockSize, ExtentBlocks: spec.ExtentBlocks, ExtentCount: spec.ExtentCount}
}
