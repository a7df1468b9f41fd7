package downstairs

import (
	"bytes"
	"encoding/binary"
	"math"
	"testing"
	"time"

	"tern/volume/ids"
	"tern/volume/wire"
)

// TestHostileRequestsGetErrorsNotPanics sends requests an upstairs must
// never send; each gets an Error (or a clear reply) and the session,
// and the server, carry on.
func TestHostileRequestsGetErrorsNotPanics(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	c.mustActivate(1)
	data, hashes := blocks(2, 1)
	long := append(append([]byte(nil), data...), make([]byte, testBlockSize)...)
	one, oneHash := blocks(1, 2)
	v := wire.ExtentVersion{Gen: 1, Flush: 1}
	cases := []struct {
		name string
		m    wire.Message
		code wire.ErrorCode
	}{
		{"write data longer than its hashes", &wire.Write{JobID: c.jobID(), Hashes: hashes, Data: long}, wire.CodeBadRequest},
		{"read running past the end", &wire.Read{JobID: c.jobID(), Offset: testExtentBlocks*testExtentCount - 1, Count: 2}, wire.CodeOutOfRange},
		{"read at the last uint64 block", &wire.Read{JobID: c.jobID(), Offset: math.MaxUint64, Count: 1}, wire.CodeOutOfRange},
		{"repair write past the extent", &wire.RepairWrite{JobID: c.jobID(), Version: v, Blocks: []uint32{testExtentBlocks}, Hashes: oneHash, Data: one}, wire.CodeOutOfRange},
		{"repair write to no extent", &wire.RepairWrite{JobID: c.jobID(), Extent: math.MaxUint32, Version: v, Blocks: []uint32{0}, Hashes: oneHash, Data: one}, wire.CodeOutOfRange},
		{"second hello", &wire.Hello{Versions: wire.SupportedVersions, UpstairsID: c.up, SessionID: c.sess}, wire.CodeBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c.t = t
			if _, ok := wire.JobOf(tc.m); !ok {
				c.send(tc.m)
				wantError(t, c.recv(), tc.code)
				return
			}
			wantError(t, c.call(tc.m), tc.code)
		})
	}
	c.t = t
	// First+Count past uint32: the versions that exist, or none.
	for _, first := range []ids.ExtentID{testExtentCount - 1, math.MaxUint32} {
		r := c.call(&wire.ExtentVersionsRequest{JobID: c.jobID(), First: first, Count: math.MaxUint32})
		switch r := r.(type) {
		case *wire.ExtentVersions:
			if uint64(r.First)+uint64(len(r.Versions)) > testExtentCount {
				t.Fatalf("versions of %d extents from %d in a region of %d", len(r.Versions), r.First, testExtentCount)
			}
		case *wire.Error:
		default:
			t.Fatalf("extent versions from %d: %s", first, describe(r))
		}
	}
	c.mustWrite(0, data) // the session still works
}

// TestUnsortedRepairBlocksEndTheSession: a repair block list must be
// strictly increasing (package wire). One with a duplicate or out of
// order does not decode, so the session that sent it ends and none of it
// is applied, neither its blocks nor its extent version.
func TestUnsortedRepairBlocksEndTheSession(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	two, twoHashes := blocks(2, 7)
	v := wire.ExtentVersion{Gen: 9, Flush: 9}
	gen := ids.Generation(0)
	check := func() *client {
		gen++
		c := dial(t, ts.addr(), false)
		c.mustActivate(gen)
		if got := c.mustRead(3, 2); !bytes.Equal(got.Data, make([]byte, len(two))) {
			t.Fatal("blocks of a refused repair write were stored")
		}
		r := c.call(&wire.ExtentVersionsRequest{JobID: c.jobID(), Count: 1})
		if vs, ok := r.(*wire.ExtentVersions); !ok || len(vs.Versions) != 1 || vs.Versions[0] == v {
			t.Fatalf("extent 0 version after a refused repair write: %s", describe(r))
		}
		return c
	}
	for _, bad := range [][]uint32{{3, 3}, {4, 3}} {
		for _, m := range []wire.Message{
			&wire.RepairWrite{JobID: 1, Version: v, Blocks: []uint32{3, 4}, Hashes: twoHashes, Data: two},
			&wire.RepairRead{JobID: 1, Blocks: []uint32{3, 4}},
		} {
			c := check()
			// The Encoder refuses the list, so write the frame by hand.
			frame, data, err := wire.AppendFrame(nil, m)
			if err != nil {
				t.Fatal(err)
			}
			at := bytes.Index(frame, []byte{3, 0, 0, 0, 4, 0, 0, 0})
			binary.LittleEndian.PutUint32(frame[at:], bad[0])
			binary.LittleEndian.PutUint32(frame[at+4:], bad[1])
			if _, err := c.stream.Write(append(frame, data...)); err != nil {
				t.Fatal(err)
			}
			select {
			case <-c.readDone:
			case <-time.After(testTimeout):
				t.Fatalf("%v of blocks %v did not end the session", m.Type(), bad)
			}
			for r := range c.msgs {
				t.Fatalf("%v of blocks %v answered with %s", m.Type(), bad, describe(r))
			}
		}
	}
	check()
}

// TestDependenciesOnFutureOrUnknownJobsDoNotDeadlock: the downstairs
// counts only dependencies that arrived earlier, so a session listing
// later, unknown or its own job IDs still answers everything.
func TestDependenciesOnFutureOrUnknownJobsDoNotDeadlock(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	c.mustActivate(1)
	data, hashes := blocks(4, 3)
	a, b, d := c.jobID(), c.jobID(), c.jobID()
	c.send(&wire.Write{JobID: a, Deps: []wire.JobID{b, d, 1 << 50}, Offset: 0, Hashes: hashes, Data: data})
	c.send(&wire.Write{JobID: b, Deps: []wire.JobID{b, d}, Offset: 0, Hashes: hashes, Data: data})
	c.send(&wire.Read{JobID: d, Deps: []wire.JobID{a, b, d}, Offset: 0, Count: 4})
	got := map[wire.JobID]bool{}
	for len(got) < 3 {
		m := c.recv()
		id, _ := wire.JobOf(m)
		if _, isErr := m.(*wire.Error); isErr {
			t.Fatalf("job %d: %s", id, describe(m))
		}
		got[id] = true
	}
}

// TestFloodOfRequestsIsAnsweredInFull: 10,000 requests sent without
// reading replies are all answered once the client reads, and another
// session is served meanwhile: the flooding session holds at most
// MaxJobsPerSession jobs and stops reading (QUIC flow control stops the
// sender) rather than queueing without bound.
func TestFloodOfRequestsIsAnsweredInFull(t *testing.T) {
	const n = 10000
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	c.mustActivate(1)
	first := c.next + 1
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for range n {
			if c.enc.Encode(&wire.Read{JobID: c.jobID(), Offset: 0, Count: 1}) != nil {
				return
			}
		}
	}()
	other := dial(t, ts.addr(), true)
	if _, ok := other.call(&wire.Read{JobID: other.jobID(), Offset: 0, Count: 1}).(*wire.ReadResponse); !ok {
		t.Fatal("another session was not served during the flood")
	}
	seen := make([]bool, n)
	for range n {
		m := c.recv()
		id, _ := wire.JobOf(m)
		if _, ok := m.(*wire.ReadResponse); !ok || id < first || id >= first+n || seen[id-first] {
			t.Fatalf("reply %s", describe(m))
		}
		seen[id-first] = true
	}
	<-sent
}
