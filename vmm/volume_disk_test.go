package vmm_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"tern/internal/blockio"
	"tern/vmm"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/upstairs"
	"tern/volume/volumetest"
)

// TestDiskGuestOnAThreeReplicaVolume runs the disk guest on a volume of
// three loopback downstairs, then reads every replica's region from its
// files: each must hold the guest's pattern.
func TestDiskGuestOnAThreeReplicaVolume(t *testing.T) {
	kvmtest.Require(t)
	const sectors = 256
	spec := extent.NewSpec(512, 2048, 4) // 4 MiB in 1 MiB extents
	cluster, err := volumetest.NewCluster(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	if err := cluster.StartAll(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), generous)
	defer cancel()
	up, err := upstairs.New(upstairs.Config{Targets: cluster.Targets(), TLS: cluster.ClientTLS})
	if err != nil {
		t.Fatal(err)
	}
	defer up.Close()
	if err := up.Activate(ctx, ids.Generation(1)); err != nil {
		t.Fatalf("activating the volume: %v", err)
	}
	// An activated volume is a blockio.Device as it is: its geometry
	// is known.
	var disk blockio.Device = up
	vm := newVM(t, vmm.Config{Guest: "disk", Disk: disk, Params: &guests.Params{Sectors: sectors}})
	con := newConsole(t, vm)
	r := wait(t, start(t, vm))
	if r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0, nil; console %q", r.status, r.err, con.seen)
	}
	con.waitLine(fmt.Sprintf("disk: PASS %d sectors", sectors))
	if err := vm.Close(); err != nil {
		t.Fatal(err)
	}
	if err := up.Close(); err != nil {
		t.Fatalf("closing the volume: %v", err)
	}
	if err := cluster.Close(); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		region, err := extent.Open(cluster.RegionDir(i))
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, sectors*512)
		if err := region.ReadBlocks(0, got, make([]uint64, sectors)); err != nil {
			region.Close()
			t.Fatalf("reading replica %d: %v", i, err)
		}
		region.Close()
		for s := uint64(0); s < sectors; s++ {
			if !bytes.Equal(got[s*512:(s+1)*512], guests.DiskPattern(guests.DefaultDiskSeed, s)) {
				t.Fatalf("replica %d: sector %d does not hold the disk guest's pattern", i, s)
			}
		}
	}
}
