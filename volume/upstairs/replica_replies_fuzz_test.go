package upstairs

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"runtime/metrics"
	"slices"
	"testing"

	"github.com/google/uuid"

	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// fuzzBlockSize is the region block size of FuzzReplicaReplies' session.
const fuzzBlockSize = 512

// fuzzAllocLimit bounds what one FuzzReplicaReplies input may allocate:
// the decoder's buffers grown to the largest frame, plus copies of the
// few replies a session can accept before it must end. A length the
// decoder trusted unchecked (a u32 count) would blow far past it.
const fuzzAllocLimit = 16 << 20

// fuzzSession is a session after a realistic start: the engine's jobs and
// the repair calls it sent and is owed replies for, as replica keeps them
// (sent, inflight), and the callers' buffers reads land in.
type fuzzSession struct {
	sent     map[wire.JobID]sentJob
	inflight map[wire.JobID]*call
	readBufs map[wire.JobID][]byte
}

// newFuzzSession owes replies to jobs 10-13 (two reads, a write, a flush)
// and calls 20-25 (six repair requests, one abandoned). layout rotates
// which ID is which, so one mutated byte turns a well-formed reply into
// one of the wrong type for its ID; layout 0 is what replySeeds answer.
func newFuzzSession(layout uint8) *fuzzSession {
	s := &fuzzSession{
		sent:     map[wire.JobID]sentJob{},
		inflight: map[wire.JobID]*call{},
		readBufs: map[wire.JobID][]byte{},
	}
	jobs := []sentJob{
		{kind: engine.KindWrite},
		{kind: engine.KindRead, bytes: 2 * fuzzBlockSize},
		{kind: engine.KindFlush},
		{kind: engine.KindRead, bytes: fuzzBlockSize},
	}
	for i := range jobs {
		id := wire.JobID(10 + i)
		j := jobs[(i+int(layout))%len(jobs)]
		s.sent[id] = j
		if j.kind == engine.KindRead {
			s.readBufs[id] = make([]byte, j.bytes)
		}
	}
	calls := []call{
		{req: &wire.ExtentHashesRequest{Extent: 1}},
		{req: &wire.RepairRead{Extent: 1, Blocks: []uint32{0, 2}}, data: make([]byte, 2*fuzzBlockSize)},
		{req: &wire.RepairWrite{Extent: 1, Version: wire.ExtentVersion{Gen: 3, Flush: 4}}},
		{req: &wire.ExtentVersionsRequest{Count: 2}},
		{req: &wire.RepairRead{Extent: 1, Blocks: []uint32{0, 3}}, abandoned: true},
		{req: &wire.RepairRead{Extent: 2, Blocks: []uint32{0, 2}}, data: make([]byte, 2*fuzzBlockSize)},
	}
	for i := range calls {
		c := calls[(i+int(layout>>2))%len(calls)]
		c.id = wire.JobID(20 + i)
		wire.SetJobID(c.req, c.id)
		c.reply = make(chan callResult, 1)
		s.inflight[c.id] = &c
	}
	return s
}

// dataBuffer mirrors replica.dataBuffer: a read's data lands in its
// caller's buffer when the size is right, a call's in the call's buffer.
func (s *fuzzSession) dataBuffer(t wire.MsgType, id wire.JobID, n int) []byte {
	switch t {
	case wire.TypeRepairData:
		return callBuffer(s.inflight, id, n)
	case wire.TypeReadResponse:
		if b := s.readBufs[id]; len(b) == n {
			return b
		}
	}
	return nil
}

// replySeeds are well-formed replies to newFuzzSession's jobs and calls,
// one frame each, encoded with wire.NewEncoder.
func replySeeds(tb testing.TB) map[string][]byte {
	block := func(n int, seed byte) ([]byte, []uint64) {
		p := bytes.Repeat([]byte{seed}, n*fuzzBlockSize)
		h := make([]uint64, n)
		hashBlocks(h, p, fuzzBlockSize)
		return p, h
	}
	two, twoHashes := block(2, 1)
	one, oneHash := block(1, 2)
	frames := map[string]wire.Message{
		"ack":           &wire.Ack{JobID: 10},
		"read_response": &wire.ReadResponse{JobID: 11, Hashes: twoHashes, Data: two},
		"error":         &wire.Error{JobID: 12, Code: wire.CodeIO, Message: "disk on fire"},
		"fenced":        &wire.Fenced{ByGen: 9, ByUpstairs: uuid.MustParse("6c1f0a4e-3c55-4a59-9a8c-2d3b8e1f7a10")},
		"repair_data":   &wire.RepairData{JobID: 21, Extent: 1, Blocks: []uint32{0, 2}, Hashes: twoHashes, Data: two},
	}
	encode := func(ms ...wire.Message) []byte {
		var b bytes.Buffer
		enc := wire.NewEncoder(&b)
		for _, m := range ms {
			if err := enc.Encode(m); err != nil {
				tb.Fatalf("encoding %v: %v", m.Type(), err)
			}
		}
		return b.Bytes()
	}
	seeds := map[string][]byte{}
	for name, m := range frames {
		seeds[name] = encode(m)
	}
	seeds["truncated_read_response"] = seeds["read_response"][:wire.HeaderSize+20]
	// Wrong sizes the decoder cannot know are wrong, each refused.
	seeds["empty_read_response_for_write"] = encode(&wire.ReadResponse{JobID: 10})
	seeds["read_response_short_of_hashes"] = encode(&wire.ReadResponse{JobID: 11, Hashes: oneHash, Data: two})
	seeds["repair_data_short_of_data"] = encode(&wire.RepairData{JobID: 21, Extent: 1, Blocks: []uint32{0, 2}, Hashes: twoHashes, Data: one})
	// Every job and call answered, then a session-level Error.
	seeds["session"] = encode(
		&wire.Ack{JobID: 10}, frames["read_response"], &wire.Ack{JobID: 12},
		&wire.ReadResponse{JobID: 13, Hashes: oneHash, Data: one},
		&wire.ExtentHashes{JobID: 20, Extent: 1, Hashes: make([]uint64, 8)},
		frames["repair_data"], &wire.Ack{JobID: 22},
		&wire.ExtentVersions{JobID: 23, Versions: make([]wire.ExtentVersion, 2)},
		&wire.Error{JobID: 24, Code: wire.CodeCorruptBlock},
		&wire.RepairData{JobID: 25, Extent: 2, Blocks: []uint32{0, 2}, Hashes: twoHashes, Data: two},
		&wire.Error{Code: wire.CodeShuttingDown},
	)
	return seeds
}

// FuzzReplicaReplies feeds arbitrary bytes (in), as the stream a downstairs
// sends, through the decode-and-check path of a session (wire.Decoder
// with the session's data buffers, then checkReply against what the
// session is owed, newFuzzSession(layout)). Nothing may panic or allocate without bound; every
// frame is either accepted as answering exactly one thing owed, with the
// right type and size, or the session ends: with a framing error or
// io.EOF from the decoder, ErrProtocol from checkReply (the record left
// as it was), or a Fenced or session-level Error.
func FuzzReplicaReplies(f *testing.F) {
	// The committed corpus (testdata/fuzz, checked against replySeeds by
	// TestReplySeedsAnswerTheSession) answers layout 0. The same frames
	// under other layouts answer the wrong job or call, so every refusal
	// of checkReply starts covered: the fuzzer seldom mutates layout and
	// the stream together.
	seeds := replySeeds(f)
	for _, name := range slices.Sorted(maps.Keys(seeds)) {
		for _, layout := range []uint8{1, 2, 3, 4, 8, 12, 16, 20} {
			f.Add(layout, seeds[name])
		}
	}
	f.Fuzz(func(t *testing.T, layout uint8, in []byte) {
		s := newFuzzSession(layout)
		dec := wire.NewDecoder(bytes.NewReader(in))
		dec.DataBuffer = s.dataBuffer
		allocated := heapAllocated()
		for s.step(t, dec) {
		}
		if n := heapAllocated() - allocated; n > fuzzAllocLimit {
			t.Fatalf("%d bytes of input allocated %d bytes", len(in), n)
		}
	})
}

// heapAllocated returns the bytes allocated on the heap so far. Unlike
// runtime.ReadMemStats it does not stop the world, which would slow the
// fuzzer tenfold; it may miss small allocations still cached per P, not
// the large ones the limit is about.
func heapAllocated() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// step decodes and checks one reply; it reports whether the session
// goes on.
func (s *fuzzSession) step(t *testing.T, dec *wire.Decoder) bool {
	m, err := dec.Next()
	if err != nil {
		if err != io.EOF && !isFramingError(err) {
			t.Fatalf("decoder failed with an undocumented error: %v", err)
		}
		return false
	}
	id, _ := wire.JobOf(m)
	job, wasJob := s.sent[id]
	owedCall := s.inflight[id]
	jobs, calls := len(s.sent), len(s.inflight)
	kind, c, err := checkReply(1, m, s.sent, s.inflight, fuzzBlockSize)
	if err != nil {
		if !errors.Is(err, ErrProtocol) {
			t.Fatalf("%v refused with %v, want ErrProtocol", m.Type(), err)
		}
		if len(s.sent) != jobs || len(s.inflight) != calls {
			t.Fatalf("refused %v (%v) changed what the session is owed", m.Type(), err)
		}
		return false
	}
	switch kind {
	case replyJob:
		if !wasJob || len(s.sent) != jobs-1 || len(s.inflight) != calls {
			t.Fatalf("%v accepted for job %d, which was not owed once", m.Type(), id)
		}
		switch m := m.(type) {
		case *wire.Ack:
			if job.kind == engine.KindRead {
				t.Fatalf("Ack accepted for read %d", id)
			}
		case *wire.ReadResponse:
			if job.kind != engine.KindRead || len(m.Data) != job.bytes || len(m.Hashes)*fuzzBlockSize != len(m.Data) {
				t.Fatalf("ReadResponse of %d bytes, %d hashes accepted for %+v", len(m.Data), len(m.Hashes), job)
			}
			verifyBlocks(m.Data, m.Hashes, fuzzBlockSize)
		case *wire.Error:
		default:
			t.Fatalf("%v accepted for job %d", m.Type(), id)
		}
		return true
	case replyCall:
		if c == nil || c != owedCall || len(s.inflight) != calls-1 || len(s.sent) != jobs {
			t.Fatalf("%v accepted for call %d, which was not owed once", m.Type(), id)
		}
		want := map[wire.MsgType]wire.MsgType{
			wire.TypeExtentHashesRequest: wire.TypeExtentHashes, wire.TypeRepairRead: wire.TypeRepairData,
			wire.TypeRepairWrite: wire.TypeAck, wire.TypeExtentVersionsRequest: wire.TypeExtentVersions,
		}[c.req.Type()]
		if got := m.Type(); got != want && got != wire.TypeError && got != wire.TypeFenced {
			t.Fatalf("%v accepted for call %d, a %v", got, id, c.req.Type())
		}
		if d, ok := m.(*wire.RepairData); ok {
			r := c.req.(*wire.RepairRead)
			if d.Extent != r.Extent || !slices.Equal(d.Blocks, r.Blocks) || len(d.Data) != len(r.Blocks)*fuzzBlockSize {
				t.Fatalf("RepairData of extent %d blocks %v, %d bytes accepted for a RepairRead of extent %d blocks %v",
					d.Extent, d.Blocks, len(d.Data), r.Extent, r.Blocks)
			}
		}
		if got := cloneReply(m, c.data); got.Type() != m.Type() {
			t.Fatalf("cloned %v as %v", m.Type(), got.Type())
		}
		_, fenced := m.(*wire.Fenced)
		return !fenced
	case replyFenced:
		if _, ok := m.(*wire.Fenced); !ok {
			t.Fatalf("%v taken as fencing", m.Type())
		}
		return false
	case replySessionError:
		if e, ok := m.(*wire.Error); !ok || e.JobID != 0 && e.Code != wire.CodeFenced {
			t.Fatalf("%v taken as a session error", m.Type())
		}
		return false
	}
	t.Fatalf("checkReply(%v) returned kind %d", m.Type(), kind)
	return false
}

// TestReplySeedsAnswerTheSession: the seed stream answers every job and
// call of the fuzzed session, so the fuzzer starts from a session that
// gets deep, and the committed corpus holds exactly the seeds replySeeds
// encodes today (regenerate with TERN_WRITE_FUZZ_SEEDS=1).
func TestReplySeedsAnswerTheSession(t *testing.T) {
	seeds := replySeeds(t)
	s := newFuzzSession(0)
	dec := wire.NewDecoder(bytes.NewReader(seeds["session"]))
	dec.DataBuffer = s.dataBuffer
	for s.step(t, dec) {
	}
	if len(s.sent) != 0 || len(s.inflight) != 0 {
		t.Fatalf("session seed left jobs %v and calls %v unanswered", slices.Collect(maps.Keys(s.sent)), slices.Collect(maps.Keys(s.inflight)))
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzReplicaReplies")
	for name, seed := range seeds {
		want := fmt.Sprintf("go test fuzz v1\nbyte(%q)\n[]byte(%q)\n", uint8(0), seed)
		path := filepath.Join(dir, name)
		if os.Getenv("TERN_WRITE_FUZZ_SEEDS") != "" {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != want {
			t.Errorf("seed %s is not committed as encoded today (err %v); regenerate it", path, err)
		}
	}
}

// isFramingError reports whether err is one a Decoder documents.
func isFramingError(err error) bool {
	for _, e := range []error{wire.ErrBadMagic, wire.ErrFrameTooLarge, wire.ErrUnknownType, wire.ErrMalformed, io.ErrUnexpectedEOF} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
