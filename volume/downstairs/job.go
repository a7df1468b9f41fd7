package downstairs

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/wire"
)

// jobKind is what a job does; it names metrics too.
type jobKind uint8

const (
	kindRead jobKind = iota
	kindWrite
	kindFlush
	kindExtentVersions
	kindExtentHashes
	kindRepairRead
	kindRepairWrite
	kindActivate   // handled by the owner, never by the engine
	kindRegionInfo // answered by the owner at once
	kindInvalid    // a request that failed validation; only its Error is sent
	kindNotice     // an unsolicited Fenced; no request, no slot
	kindCount
)

var kindNames = [kindCount]string{
	"read", "write", "flush", "extent_versions", "extent_hashes", "repair_read",
	"repair_write", "activate", "region_info", "invalid", "notice",
}

// mutates reports whether the job changes the region, and so may run only
// for the active session and never after it was fenced.
func (k jobKind) mutates() bool {
	return k == kindWrite || k == kindFlush || k == kindRepairWrite
}

// job is one request of a session from decoding to reply. The session's
// reader fills it, the owner orders it, a worker executes it and the
// writer sends its reply and returns it to the pool. Its slices are reused
// across jobs.
type job struct {
	sess *session
	kind jobKind
	id   wire.JobID
	deps []wire.JobID

	offset      ids.BlockIndex
	count       uint32
	extent      ids.ExtentID
	flushNumber uint64
	gen         ids.Generation
	version     wire.ExtentVersion
	blocks      []uint32
	hashes      []uint64
	buf         *[]byte // pooled data: write payload or read result
	versions    []wire.ExtentVersion
	upstairs    uuid.UUID // Activate only
	lostWrites  bool      // Activate only: the region may have lost writes

	// Result, set by the worker.
	failed  bool
	code    wire.ErrorCode
	errMsg  string
	fenced  *fenceInfo
	started time.Time
}

var jobPool = sync.Pool{New: func() any { return new(job) }}

func newJob(s *session, kind jobKind, id wire.JobID, deps []wire.JobID) *job {
	j := jobPool.Get().(*job)
	j.sess, j.kind, j.id = s, kind, id
	j.deps = append(j.deps[:0], deps...)
	j.started = time.Now()
	return j
}

// release returns the job and its buffer to their pools.
func (j *job) release(p *bufPool) {
	p.put(j.buf)
	*j = job{deps: j.deps[:0], blocks: j.blocks[:0], hashes: j.hashes[:0], versions: j.versions[:0]}
	jobPool.Put(j)
}

func (j *job) data() []byte {
	if j.buf == nil {
		return nil
	}
	return *j.buf
}

// key describes the job to the engine.
func (j *job) key(spec extent.Spec) jobKey {
	count := uint64(j.count)
	if j.kind == kindWrite {
		count = uint64(len(j.hashes))
	}
	k := jobKey{id: j.id, deps: j.deps}
	k.mode, k.first, k.end = accessOf(j.kind, uint64(j.offset), count, j.extent, spec.ExtentBlocks)
	return k
}

// accessOf is what a job of kind touches, for the ordering engine: blocks
// [offset, offset+count) for a read or write, extent's blocks for a
// repair request.
func accessOf(kind jobKind, offset, count uint64, extent ids.ExtentID, extentBlocks uint32) (mode access, first, end uint64) {
	eb := uint64(extentBlocks)
	switch kind {
	case kindRead:
		return accessRead, offset, offset + count
	case kindWrite:
		return accessWrite, offset, offset + count
	case kindFlush:
		return accessFlush, 0, 0
	case kindExtentVersions:
		return accessMeta, 0, 0
	case kindExtentHashes, kindRepairRead:
		return accessRead, uint64(extent) * eb, uint64(extent+1) * eb
	case kindRepairWrite:
		// A repair also rewrites the extent's version: order it like a
		// flush against metadata readers by treating it as a write of the
		// whole extent (flushes and meta reads conflict with every write).
		return accessWrite, uint64(extent) * eb, uint64(extent+1) * eb
	}
	return 0, 0, 0
}

// admit is a session's admission rule for a request of kind (not
// Activate or RegionInfo, which the owner answers itself) from a session
// that is not fenced: a mutation never on a read-only session; a
// mutation, a repair read, or a read of a session that could activate
// only once the session is active; a flush only at the session's
// generation. It returns the code to refuse with, or ok.
func admit(kind jobKind, readOnly, active bool, flushGen, sessionGen ids.Generation) (code wire.ErrorCode, ok bool) {
	switch {
	case kind.mutates() && readOnly:
		return wire.CodeReadOnly, false
	case (kind.mutates() || kind == kindRepairRead || (kind == kindRead && !readOnly)) && !active:
		return wire.CodeNotActive, false
	case kind == kindFlush && flushGen != sessionGen:
		return wire.CodeBadRequest, false
	}
	return 0, true
}

// fail records an error result.
func (j *job) fail(code wire.ErrorCode, format string, args ...any) {
	j.failed, j.code, j.errMsg = true, code, fmt.Sprintf(format, args...)
}

// failErr records err, classified into a wire error code.
func (j *job) failErr(err error) {
	j.failed, j.code, j.errMsg = true, codeOf(err), err.Error()
}

// codeOf maps a region error to the code an upstairs branches on.
func codeOf(err error) wire.ErrorCode {
	switch {
	case errors.Is(err, extent.ErrHashMismatch):
		return wire.CodeHashMismatch
	case errors.Is(err, extent.ErrOutOfRange):
		return wire.CodeOutOfRange
	case errors.Is(err, extent.ErrCorruptBlock):
		return wire.CodeCorruptBlock
	case errors.Is(err, extent.ErrUnaligned):
		return wire.CodeBadRequest
	case errors.Is(err, extent.ErrReadOnly):
		return wire.CodeReadOnly
	case errors.Is(err, extent.ErrClosed):
		return wire.CodeShuttingDown
	}
	return wire.CodeIO
}

// execute runs the job against the region on a worker goroutine.
// Mutations hold the fence's read lock from the active check through the
// region call, so a takeover (which takes the write lock) happens either
// wholly before or wholly after each of them.
func (j *job) execute(srv *Server) {
	r := srv.region
	if j.kind.mutates() {
		srv.fence.mu.RLock()
		defer srv.fence.mu.RUnlock()
		if j.sess != srv.fence.active {
			j.fenced = j.sess.fencedBy()
			if j.fenced == nil {
				j.fail(wire.CodeNotActive, "session is not active")
			}
			return
		}
	} else if f := j.sess.fencedBy(); f != nil {
		j.fenced = f
		return
	}
	switch j.kind {
	case kindWrite:
		if err := r.WriteBlocks(ids.BlockIndex(j.offset), j.data(), j.hashes); err != nil {
			j.failErr(err)
		}
	case kindRead:
		j.buf = srv.bufs.get(int(j.count) * int(srv.spec.BlockSize))
		j.hashes = grow(j.hashes, int(j.count))
		if err := r.ReadBlocks(ids.BlockIndex(j.offset), j.data(), j.hashes); err != nil {
			j.failErr(err)
		}
	case kindFlush:
		if err := r.Flush(j.flushNumber, ids.Generation(j.gen)); err != nil {
			j.failErr(err)
		}
	case kindExtentVersions:
		total := uint64(srv.spec.ExtentCount)
		if uint64(j.extent) >= total {
			j.fail(wire.CodeOutOfRange, "extent %d of %d", j.extent, total)
			return
		}
		n := total - uint64(j.extent)
		if j.count != 0 {
			n = min(n, uint64(j.count))
		}
		n = min(n, wire.MaxExtentVersions)
		j.versions = j.versions[:0]
		for e := range n {
			v, err := r.ExtentVersion(ids.ExtentID(uint64(j.extent) + e))
			if err != nil {
				j.failErr(err)
				return
			}
			j.versions = append(j.versions, wireVersion(v))
		}
	case kindExtentHashes:
		hs, err := r.ExtentHashes(ids.ExtentID(j.extent), j.hashes)
		j.hashes = hs
		if err != nil {
			j.failErr(err)
			return
		}
		v, err := r.ExtentVersion(ids.ExtentID(j.extent))
		if err != nil {
			j.failErr(err)
			return
		}
		j.version = wireVersion(v)
	case kindRepairRead:
		j.buf = srv.bufs.get(len(j.blocks) * int(srv.spec.BlockSize))
		j.hashes = grow(j.hashes, len(j.blocks))
		if err := r.ReadExtentBlocks(ids.ExtentID(j.extent), j.blocks, j.data(), j.hashes); err != nil {
			j.failErr(err)
		}
	case kindRepairWrite:
		v := extent.Version{Gen: ids.Generation(j.version.Gen), Flush: j.version.Flush, Dirty: j.version.Dirty}
		if err := r.RepairExtent(ids.ExtentID(j.extent), j.blocks, j.data(), j.hashes, v); err != nil {
			j.failErr(err)
		}
	}
}

func wireVersion(v extent.Version) wire.ExtentVersion {
	return wire.ExtentVersion{Gen: ids.Generation(v.Gen), Flush: v.Flush, Dirty: v.Dirty}
}

func grow(s []uint64, n int) []uint64 {
	if cap(s) < n {
		return make([]uint64, n)
	}
	return s[:n]
}
