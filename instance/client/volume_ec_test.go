package client_test

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"tern/instance/apiv1"
	"tern/volume/extent"
	"tern/volume/volumetest"
)

// TestErasureCodedVolumeDiskRunsTheDiskGuest runs the disk guest on a 4+2
// erasure-coded volume of six real downstairs, one of them down: the
// guest writes and verifies its pattern through the EC volume, and the
// disk's view lists the six shards. A layout that is out of range, or
// that does not match the targets, is refused with a 400 naming it.
func TestErasureCodedVolumeDiskRunsTheDiskGuest(t *testing.T) {
	spec := extent.Spec{UUID: uuid.New(), BlockSize: 512, ExtentBlocks: 128, ExtentCount: 4, FormatVersion: extent.FormatVersion1}
	cluster, err := volumetest.NewClusterN(t.TempDir(), spec, 6)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.StartAll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Close() })
	targets := cluster.Targets()
	if err := cluster.Stop(5); err != nil {
		t.Fatal(err)
	}
	p := startVMM(t, filepath.Join(cluster.Dir, "certs"))
	c, ctx := p.client, ctx(t)
	wait := uint64(200)
	backend := apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: targets,
		Layout: &apiv1.LayoutSpec{Kind: apiv1.LayoutEC, Data: 4, Parity: 2},
		Region: &apiv1.RegionSpec{BlockSize: 512, ExtentBlocks: 128, ExtentCount: 4}, Gen: 1, QuorumWaitMs: &wait}
	is := apiv1.Spec{ID: "ecdisk", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "disk", Params: map[string]uint64{"seed": 9, "sectors": 64}},
		Disks: []apiv1.DiskSpec{{Name: "vol", Backend: backend}},
		Init:  apiv1.InitSpec{Method: apiv1.InitSpecMethod}}

	bad := is
	badBackend := backend
	badBackend.Layout = &apiv1.LayoutSpec{Kind: apiv1.LayoutEC, Data: 4, Parity: 4}
	bad.Disks = []apiv1.DiskSpec{{Name: "vol", Backend: badBackend}}
	if _, err := c.Ensure(ctx, bad); err == nil || !strings.Contains(err.Error(), "400") || !strings.Contains(err.Error(), "parity 4") {
		t.Fatalf("ensure with parity 4: %v; want a 400 naming the layout", err)
	}
	badBackend = backend
	badBackend.Targets = targets[:3]
	bad.Disks = []apiv1.DiskSpec{{Name: "vol", Backend: badBackend}}
	if _, err := c.Ensure(ctx, bad); err == nil || !strings.Contains(err.Error(), "wants 6 host:port addresses") {
		t.Fatalf("ensure with 3 targets for 4+2: %v; want a 400 naming the count", err)
	}

	if _, err := c.Ensure(ctx, is); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
		t.Fatal(err)
	}
	h, err := c.SerialHistory(ctx, 0, 0)
	if err != nil || !strings.Contains(h.Data, "disk: PASS 64 sectors") {
		t.Fatalf("console %q, %v; want the disk guest's PASS", h.Data, err)
	}
	d, err := c.Disk(ctx, "vol")
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Replicas) != 6 || d.Kind != apiv1.BackendVolume {
		t.Fatalf("disk view %+v; want six shards", d)
	}
}
