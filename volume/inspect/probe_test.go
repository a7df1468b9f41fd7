package inspect

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
	"tern/volume/volumetest"
)

func newCluster(t *testing.T) *volumetest.Cluster {
	t.Helper()
	spec := extent.NewSpec(4096, 16, 4)
	cl, err := volumetest.NewCluster(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	return cl
}

// writeOnReplica dirties (and optionally flushes) one extent of one
// replica's region directly on disk, the way a crash mid-write leaves it.
func writeOnReplica(t *testing.T, cl *volumetest.Cluster, i int, block ids.BlockIndex, flush bool) {
	t.Helper()
	r, err := extent.Open(cl.RegionDir(i))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p := make([]byte, 4096)
	p[0] = 0xAB
	if err := r.WriteBlocks(block, p, []uint64{xxhash.Sum64(p)}); err != nil {
		t.Fatal(err)
	}
	if flush {
		if err := r.Flush(7, 3); err != nil {
			t.Fatal(err)
		}
	}
}

func TestProbeCountsDisagreeingExtents(t *testing.T) {
	cl := newCluster(t)
	writeOnReplica(t, cl, 0, 0, false)   // extent 0 dirty on replica 0
	writeOnReplica(t, cl, 1, 16*2, true) // extent 2 flushed further on replica 1
	if err := cl.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := Probe(ctx, cl.Targets(), cl.ClientTLS, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rep.ExtentsTotal != 4 || rep.ExtentsDisagreeing != 2 {
		t.Fatalf("report %+v: want 4 extents, 2 disagreeing", rep)
	}
	for _, r := range rep.Replicas {
		if !r.Reachable || r.Region == nil || r.Region.ExtentCount != 4 {
			t.Fatalf("replica %+v", r)
		}
	}
	if rep.Replicas[0].DirtyExtents != 1 {
		t.Fatalf("replica 0 reports %d dirty extents, want 1", rep.Replicas[0].DirtyExtents)
	}
}

func TestProbeReportsUnreachableReplicaAndCarriesOn(t *testing.T) {
	cl := newCluster(t)
	if err := cl.StartAll(); err != nil {
		t.Fatal(err)
	}
	targets := cl.Targets()
	if err := cl.Stop(2); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Bounds the stopped replica's probe; the live ones need far less.
	rep, err := Probe(ctx, targets, cl.ClientTLS, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replicas[2].Reachable || rep.Replicas[2].Error == "" || !rep.Replicas[0].Reachable {
		t.Fatalf("report %+v", rep.Replicas)
	}
	if rep.ExtentsDisagreeing != 0 {
		t.Fatalf("fresh replicas disagree on %d extents", rep.ExtentsDisagreeing)
	}
	for i := range 2 {
		cl.Stop(i)
	}
	if _, err := Probe(ctx, targets, cl.ClientTLS, time.Second); !errors.Is(err, ErrNoReplica) {
		t.Fatalf("probe of no live replica: %v", err)
	}
}

// TestProbeDoesNotFenceTheActiveUpstairs: a status probe in the middle of
// an active upstairs' IO leaves it active and its IO working.
func TestProbeDoesNotFenceTheActiveUpstairs(t *testing.T) {
	cl := newCluster(t)
	if err := cl.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	up, err := upstairs.New(upstairs.Config{Targets: cl.Targets(), TLS: cl.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	if err := up.Activate(ctx, 1); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4096)
	buf[0] = 1
	if _, err := up.WriteAt(ctx, buf, 0); err != nil {
		t.Fatal(err)
	}
	rep, err := Probe(ctx, cl.Targets(), cl.ClientTLS, 5*time.Second)
	if err != nil || rep.ExtentsTotal != 4 {
		t.Fatalf("probe: %+v, %v", rep, err)
	}
	if rep.Replicas[0].DirtyExtents != 1 || rep.ExtentsDisagreeing != 1 {
		t.Fatalf("probe of a live volume with one unflushed write: %+v", rep)
	}
	buf[0] = 2
	if _, err := up.WriteAt(ctx, buf, 4096); err != nil {
		t.Fatalf("write after the probe: %v", err)
	}
	if err := up.Flush(ctx); err != nil {
		t.Fatalf("flush after the probe: %v", err)
	}
	for i, r := range up.Status().Replicas {
		if r.State != engine.ReplicaActive {
			t.Fatalf("replica %d is %s after the probe", i, r.State)
		}
	}
}
