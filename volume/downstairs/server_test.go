package downstairs

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"tern/internal/testwait"
	"tern/internal/tlsconf/tlstest"
	"tern/volume/ids"
	"tern/volume/wire"
)

func TestWriteReadFlushRoundTrip(t *testing.T) {
	dir, spec := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	if r, ok := c.call(&wire.RegionInfoRequest{JobID: c.jobID()}).(*wire.RegionInfoReply); !ok || r.Region.UUID != spec.UUID || r.Region.ExtentCount != testExtentCount {
		t.Fatalf("region info %+v", r)
	}
	c.mustActivate(3)
	// Spans extents 0 and 1.
	data, hashes := blocks(8, 7)
	c.mustWrite(testExtentBlocks-4, data)
	got := c.mustRead(testExtentBlocks-4, 8)
	if !bytes.Equal(got.Data, data) || !equal(got.Hashes, hashes) {
		t.Fatal("read back differs from written data")
	}
	if r, ok := c.call(&wire.Flush{JobID: c.jobID(), FlushNumber: 1, Gen: 3}).(*wire.Ack); !ok {
		t.Fatalf("flush: %s", describe(r))
	}
	v, ok := c.call(&wire.ExtentVersionsRequest{JobID: c.jobID()}).(*wire.ExtentVersions)
	if !ok || len(v.Versions) != testExtentCount {
		t.Fatalf("versions: %s", describe(v))
	}
	want := []wire.ExtentVersion{{Gen: 3, Flush: 1}, {Gen: 3, Flush: 1}, {}, {}}
	if !equal(v.Versions, want) {
		t.Fatalf("versions %+v, want %+v", v.Versions, want)
	}
	// Unwritten blocks read as zeros.
	if z := c.mustRead(200, 2); !bytes.Equal(z.Data, make([]byte, 2*testBlockSize)) {
		t.Fatal("unwritten blocks are not zero")
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestHashMismatchStoresNothing(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	c.mustActivate(1)
	data, hashes := blocks(4, 1)
	hashes[2] ^= 1
	r := c.call(&wire.Write{JobID: c.jobID(), Offset: 10, Hashes: hashes, Data: data})
	wantError(t, r, wire.CodeHashMismatch)
	if got := c.mustRead(10, 4); !bytes.Equal(got.Data, make([]byte, len(data))) {
		t.Fatal("a write with a bad hash stored data")
	}
}

func TestMalformedRequestsAreRefusedNotFatal(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	c.mustActivate(1)
	data, hashes := blocks(2, 1)
	cases := []struct {
		name string
		m    wire.Message
		code wire.ErrorCode
	}{
		{"data shorter than hashes", &wire.Write{JobID: c.jobID(), Offset: 0, Hashes: append(hashes, 1), Data: data}, wire.CodeBadRequest},
		{"write past the end", &wire.Write{JobID: c.jobID(), Offset: testExtentBlocks*testExtentCount - 1, Hashes: hashes, Data: data}, wire.CodeOutOfRange},
		{"read past the end", &wire.Read{JobID: c.jobID(), Offset: 1 << 40, Count: 1}, wire.CodeOutOfRange},
		{"read of zero blocks", &wire.Read{JobID: c.jobID(), Offset: 0, Count: 0}, wire.CodeBadRequest},
		{"read over 1 MiB", &wire.Read{JobID: c.jobID(), Offset: 0, Count: 257}, wire.CodeBadRequest},
		{"flush with another generation", &wire.Flush{JobID: c.jobID(), FlushNumber: 1, Gen: 9}, wire.CodeBadRequest},
		{"reply sent as a request", &wire.Ack{JobID: c.jobID()}, wire.CodeBadRequest},
		{"extent hashes past the end", &wire.ExtentHashesRequest{JobID: c.jobID(), Extent: testExtentCount}, wire.CodeOutOfRange},
		{"repair read past the extent", &wire.RepairRead{JobID: c.jobID(), Extent: 0, Blocks: []uint32{testExtentBlocks}}, wire.CodeOutOfRange},
	}
	for _, tc := range cases {
		wantError(t, c.call(tc.m), tc.code)
	}
	c.mustWrite(0, data) // the session still works
}

func TestNotActiveSessionCannotWriteOrRead(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	data, _ := blocks(1, 1)
	wantError(t, c.write(0, data), wire.CodeNotActive)
	wantError(t, c.read(0, 1), wire.CodeNotActive)
	wantError(t, c.call(&wire.Flush{JobID: c.jobID(), FlushNumber: 1}), wire.CodeNotActive)
	wantError(t, c.call(&wire.RepairRead{JobID: c.jobID(), Blocks: []uint32{0}}), wire.CodeNotActive)
	if _, ok := c.call(&wire.ExtentVersionsRequest{JobID: c.jobID()}).(*wire.ExtentVersions); !ok {
		t.Fatal("extent versions refused before activation")
	}
}

// TestPipelinedOverlappingJobsRunInOrder sends many overlapping writes
// and reads without waiting; each read must see exactly the writes sent
// before it, whatever the worker pool's interleaving.
func TestPipelinedOverlappingJobsRunInOrder(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	c.mustActivate(1)
	const rounds = 40
	type readCheck struct {
		id   wire.JobID
		want []byte
	}
	var checks []readCheck
	model := make([]byte, 16*testBlockSize)
	sent := 0
	var prev wire.JobID
	for i := range rounds {
		off := i % 9
		n := 1 + i%7
		data, hashes := blocks(n, byte(i+1))
		id := c.jobID()
		var deps []wire.JobID
		if i%3 == 0 && prev != 0 {
			deps = []wire.JobID{prev} // explicit dependency on some jobs
		}
		c.send(&wire.Write{JobID: id, Deps: deps, Offset: ids.BlockIndex(off), Hashes: hashes, Data: data})
		copy(model[off*testBlockSize:], data)
		prev = id
		sent++
		rid := c.jobID()
		c.send(&wire.Read{JobID: rid, Offset: 0, Count: 16})
		checks = append(checks, readCheck{rid, bytes.Clone(model)})
		sent++
	}
	reads := map[wire.JobID][]byte{}
	for range sent {
		switch m := c.recv().(type) {
		case *wire.Ack:
		case *wire.ReadResponse:
			reads[m.JobID] = m.Data
		default:
			t.Fatalf("unexpected %s", describe(m))
		}
	}
	for i, ch := range checks {
		if !bytes.Equal(reads[ch.id], ch.want) {
			t.Fatalf("read %d (job %d) saw data out of order", i, ch.id)
		}
	}
}

func TestHigherGenerationFencesOlderSession(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	a := dial(t, ts.addr(), false)
	a.mustActivate(1)
	data, _ := blocks(1, 1)
	a.mustWrite(0, data)

	b := dial(t, ts.addr(), false)
	wantError(t, b.activate(1), wire.CodeGenTooLow)
	b.mustActivate(2)

	// A hears of it unprompted, then on every request.
	if f, ok := a.recv().(*wire.Fenced); !ok || f.JobID != 0 || f.ByGen != 2 || f.ByUpstairs != b.up {
		t.Fatalf("no unsolicited Fenced: %+v", f)
	}
	wantFenced(t, a.write(1, data), 2)
	wantFenced(t, a.read(0, 1), 2)
	wantFenced(t, a.call(&wire.Flush{JobID: a.jobID(), FlushNumber: 1, Gen: 1}), 2)
	wantFenced(t, a.activate(3), 2)

	// B sees A's acknowledged write; A's fenced one never landed.
	if got := b.mustRead(0, 2); !bytes.Equal(got.Data[:testBlockSize], data) || !bytes.Equal(got.Data[testBlockSize:], make([]byte, testBlockSize)) {
		t.Fatal("region content wrong after takeover")
	}
	// Activation at or below the highest generation is refused to anyone.
	c := dial(t, ts.addr(), false)
	wantError(t, c.activate(2), wire.CodeGenTooLow)
	wantError(t, c.activate(1), wire.CodeGenTooLow)
}

// TestFencedInFlightWritesAreNeverAppliedAfterTakeover pipelines writes
// from A while B takes over: every write of A is either acknowledged (and
// then present) or answered Fenced (and then absent), never half.
func TestFencedInFlightWritesAreNeverAppliedAfterTakeover(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	a := dial(t, ts.addr(), false)
	a.mustActivate(1)
	b := dial(t, ts.addr(), false)
	const writes = 120
	offsets := map[wire.JobID]ids.BlockIndex{}
	data, hashes := blocks(1, 0xa5)
	go func() {
		for i := range writes {
			id := wire.JobID(5000 + i)
			a.enc.Encode(&wire.Write{JobID: id, Offset: ids.BlockIndex(i), Hashes: hashes, Data: data})
		}
	}()
	for i := range writes {
		offsets[wire.JobID(5000+i)] = ids.BlockIndex(i)
	}
	b.mustActivate(2)
	acked := map[ids.BlockIndex]bool{}
	for got := 0; got < writes; {
		switch m := a.recv().(type) {
		case *wire.Ack:
			acked[offsets[m.JobID]] = true
			got++
		case *wire.Fenced:
			if m.JobID != 0 {
				got++
			}
		default:
			t.Fatalf("unexpected %s", describe(m))
		}
	}
	all := b.mustRead(0, writes)
	for i := range writes {
		blk := all.Data[i*testBlockSize : (i+1)*testBlockSize]
		if acked[ids.BlockIndex(i)] != bytes.Equal(blk, data) {
			t.Fatalf("block %d: acked=%v but present=%v", i, acked[ids.BlockIndex(i)], bytes.Equal(blk, data))
		}
	}
	t.Logf("%d of %d writes applied before the takeover", len(acked), writes)
}

func TestFencingSurvivesRestart(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	a := dial(t, ts.addr(), false)
	a.mustActivate(5)
	a.close()
	ts.stop()

	ts2 := startServer(t, dir)
	b := dial(t, ts2.addr(), false)
	wantError(t, b.activate(5), wire.CodeGenTooLow)
	wantError(t, b.activate(4), wire.CodeGenTooLow)
	b.mustActivate(6)
}

func TestReadOnlySessionDoesNotFence(t *testing.T) {
	dir, spec := newRegionDir(t)
	ts := startServer(t, dir)
	a := dial(t, ts.addr(), false)
	a.mustActivate(1)
	data, hashes := blocks(2, 3)
	a.mustWrite(4, data)

	ro := dial(t, ts.addr(), true)
	if r, ok := ro.call(&wire.RegionInfoRequest{JobID: ro.jobID()}).(*wire.RegionInfoReply); !ok || r.Region.UUID != spec.UUID {
		t.Fatalf("region info: %s", describe(r))
	}
	if _, ok := ro.call(&wire.ExtentVersionsRequest{JobID: ro.jobID(), First: 1, Count: 2}).(*wire.ExtentVersions); !ok {
		t.Fatal("extent versions refused to a read-only session")
	}
	h, ok := ro.call(&wire.ExtentHashesRequest{JobID: ro.jobID(), Extent: 0}).(*wire.ExtentHashes)
	if !ok || len(h.Hashes) != testExtentBlocks || h.Hashes[4] != hashes[0] || h.Hashes[5] != hashes[1] || !h.Version.Dirty {
		t.Fatalf("extent hashes: %s", describe(h))
	}
	if r := ro.mustRead(4, 2); !bytes.Equal(r.Data, data) {
		t.Fatal("read-only read differs")
	}
	wantError(t, ro.write(0, data), wire.CodeReadOnly)
	wantError(t, ro.activate(9), wire.CodeReadOnly)
	wantError(t, ro.call(&wire.RepairRead{JobID: ro.jobID(), Blocks: []uint32{0}}), wire.CodeNotActive)

	// The writer is untouched.
	a.mustWrite(6, data)
	if r, ok := a.call(&wire.Flush{JobID: a.jobID(), FlushNumber: 1, Gen: 1}).(*wire.Ack); !ok {
		t.Fatalf("flush after read-only session: %s", describe(r))
	}
	select {
	case m := <-a.msgs:
		t.Fatalf("writer received %s", describe(m))
	default:
	}
}

func TestRepairCopiesBlocksBetweenReplicas(t *testing.T) {
	srcDir, spec := newRegionDir(t)
	src := startServer(t, srcDir)
	dstDir := t.TempDir()
	if err := Create(dstDir, spec); err != nil {
		t.Fatal(err)
	}
	dst := startServer(t, dstDir)
	a, b := dial(t, src.addr(), false), dial(t, dst.addr(), false)
	a.mustActivate(1)
	b.mustActivate(1)
	data, _ := blocks(3, 9)
	a.mustWrite(testExtentBlocks+10, data)
	a.call(&wire.Flush{JobID: a.jobID(), FlushNumber: 4, Gen: 1})

	sh, ok := a.call(&wire.ExtentHashesRequest{JobID: a.jobID(), Extent: 1}).(*wire.ExtentHashes)
	if !ok {
		t.Fatal("source extent hashes")
	}
	dh, ok := b.call(&wire.ExtentHashesRequest{JobID: b.jobID(), Extent: 1}).(*wire.ExtentHashes)
	if !ok {
		t.Fatal("destination extent hashes")
	}
	var differ []uint32
	for i := range sh.Hashes {
		if sh.Hashes[i] != dh.Hashes[i] {
			differ = append(differ, uint32(i))
		}
	}
	if !equal(differ, []uint32{10, 11, 12}) {
		t.Fatalf("differing blocks %v", differ)
	}
	rd, ok := a.call(&wire.RepairRead{JobID: a.jobID(), Extent: 1, Blocks: differ}).(*wire.RepairData)
	if !ok || !bytes.Equal(rd.Data, data) {
		t.Fatalf("repair read: %s", describe(rd))
	}
	rw := &wire.RepairWrite{JobID: b.jobID(), Extent: 1, Version: sh.Version, Blocks: rd.Blocks, Hashes: rd.Hashes, Data: rd.Data}
	if r, ok := b.call(rw).(*wire.Ack); !ok {
		t.Fatalf("repair write: %s", describe(r))
	}
	after, _ := b.call(&wire.ExtentHashesRequest{JobID: b.jobID(), Extent: 1}).(*wire.ExtentHashes)
	if !equal(after.Hashes, sh.Hashes) || after.Version != sh.Version {
		t.Fatalf("destination after repair: version %+v want %+v", after.Version, sh.Version)
	}
	// A repair write with a bad hash is refused.
	bad := &wire.RepairWrite{JobID: b.jobID(), Extent: 2, Version: sh.Version, Blocks: []uint32{0}, Hashes: []uint64{1}, Data: data[:testBlockSize]}
	wantError(t, b.call(bad), wire.CodeHashMismatch)
}

func TestHandshakeRefusals(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	cases := []struct {
		name  string
		hello *wire.Hello
		code  wire.ErrorCode
	}{
		{"no common version", &wire.Hello{Versions: []wire.ProtocolVersion{99}}, wire.CodeVersionMismatch},
		{"other region", &wire.Hello{Versions: wire.SupportedVersions, RegionUUID: uuid.New()}, wire.CodeRegionMismatch},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := dialRaw(t, ts.addr(), tlstest.Shared(t).ClientConfig("127.0.0.1"))
			if err != nil {
				t.Fatal(err)
			}
			c.send(tc.hello)
			wantError(t, c.recv(), tc.code)
		})
	}
	// A first frame that is not Hello.
	c, err := dialRaw(t, ts.addr(), tlstest.Shared(t).ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	c.send(&wire.Ack{JobID: 1})
	wantError(t, c.recv(), wire.CodeBadRequest)
}

func TestGarbageOnTheStreamEndsOnlyThatSession(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	good := dial(t, ts.addr(), false)
	good.mustActivate(1)
	bad := dial(t, ts.addr(), false)
	bad.stream.Write([]byte("this is not a frame header at all"))
	select {
	case <-bad.readDone:
	case <-time.After(testTimeout):
		t.Fatal("session with garbage was not closed")
	}
	data, _ := blocks(1, 1)
	good.mustWrite(0, data)
}

func TestUntrustedClientCertificateIsRefused(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	strangerDir := t.TempDir()
	if err := tlsGenerate(strangerDir); err != nil {
		t.Fatal(err)
	}
	stranger := tlsLoad(t, strangerDir)
	conf := stranger.ClientConfig("127.0.0.1")
	conf.RootCAs = tlstest.Shared(t).ServerConfig().ClientCAs // trusts the server, but is not trusted
	c, err := dialRaw(t, ts.addr(), conf)
	if err != nil {
		return // refused during the handshake
	}
	c.enc.Encode(&wire.Hello{Versions: wire.SupportedVersions})
	select {
	case m, ok := <-c.msgs:
		if ok {
			t.Fatalf("untrusted client got %s", describe(m))
		}
	case <-time.After(testTimeout):
		t.Fatal("untrusted connection neither refused nor answered")
	}
	if strings.Contains(ts.logs.String(), `"msg":"session started"`) {
		t.Fatal("a session started for an untrusted client")
	}
}

func TestRunLogsListeningAndStopsCleanly(t *testing.T) {
	dir, _ := newRegionDir(t)
	logs := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	before := testwait.Running()
	go func() {
		done <- Run(ctx, Config{Dir: dir, Listen: "127.0.0.1:0", TLS: tlstest.Shared(t).ServerConfig(), Logger: jsonLogger(logs)})
	}()
	addr := waitListening(t, logs)
	c := dial(t, addr, false)
	c.mustActivate(1)
	data, _ := blocks(1, 1)
	c.mustWrite(0, data)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Run did not stop")
	}
	c.close()
	before.Returned(t, testTimeout)
}

func TestServerShutdownWithJobsInFlightLeaksNothing(t *testing.T) {
	before := testwait.Running()
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	clients := []*client{dial(t, ts.addr(), false), dial(t, ts.addr(), true)}
	clients[0].mustActivate(1)
	data, hashes := blocks(64, 1)
	for i := range 20 {
		clients[0].send(&wire.Write{JobID: wire.JobID(9000 + i), Offset: 0, Hashes: hashes, Data: data})
	}
	ts.stop()
	for _, c := range clients {
		c.close()
	}
	before.Returned(t, testTimeout)
}

func TestMetricsCountJobsAndBytes(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	c.mustActivate(1)
	data, _ := blocks(2, 1)
	c.mustWrite(0, data)
	c.mustRead(0, 2)
	var out bytes.Buffer
	ts.set.WritePrometheus(&out)
	text := out.String()
	for _, want := range []string{
		`tern_downstairs_jobs_total{kind="write"} 1`,
		`tern_downstairs_jobs_total{kind="read"} 1`,
		`tern_downstairs_written_bytes_total 8192`,
		`tern_downstairs_read_bytes_total 8192`,
		`tern_downstairs_sessions 1`,
		`tern_downstairs_active_sessions 1`,
		`tern_downstairs_job_duration_seconds_bucket{kind="write"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestRequestsBeforeHalfCloseAreAllAnswered(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	c := dial(t, ts.addr(), false)
	c.mustActivate(1)
	data, hashes := blocks(4, 2)
	const n = 30
	for i := range n {
		c.send(&wire.Write{JobID: wire.JobID(7000 + i), Offset: 0, Hashes: hashes, Data: data})
	}
	c.stream.Close() // no more requests; replies still wanted
	for range n {
		if m, ok := c.recv().(*wire.Ack); !ok {
			t.Fatalf("got %s, want Ack", describe(m))
		}
	}
}

// dialAs connects and completes Hello as the given upstairs.
func dialAs(t *testing.T, addr string, up uuid.UUID) *client {
	t.Helper()
	c, err := dialRaw(t, addr, tlstest.Shared(t).ClientConfig("127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	c.up = up
	c.send(&wire.Hello{Versions: wire.SupportedVersions, UpstairsID: c.up, SessionID: c.sess})
	if _, ok := c.recv().(*wire.HelloReply); !ok {
		t.Fatal("no HelloReply")
	}
	return c
}

// TestHolderRejoinsAtItsGenerationAfterRestart: the upstairs that holds
// the highest generation reconnects (new session, same upstairs id) after
// the downstairs restarted and may activate at that generation again to
// replay its backlog; any other upstairs still needs a higher one, and
// once it takes over the old holder cannot come back.
func TestHolderRejoinsAtItsGenerationAfterRestart(t *testing.T) {
	dir, _ := newRegionDir(t)
	ts := startServer(t, dir)
	holder := uuid.New()
	a := dialAs(t, ts.addr(), holder)
	a.mustActivate(5)
	a.close()
	ts.stop()

	ts2 := startServer(t, dir)
	a2 := dialAs(t, ts2.addr(), holder)
	a2.mustActivate(5)
	data, _ := blocks(1, 9)
	a2.mustWrite(0, data)

	b := dial(t, ts2.addr(), false)
	wantError(t, b.activate(5), wire.CodeGenTooLow)
	b.mustActivate(6)
	a3 := dialAs(t, ts2.addr(), holder)
	wantError(t, a3.activate(5), wire.CodeGenTooLow)
	wantError(t, a3.activate(6), wire.CodeGenTooLow)
}
