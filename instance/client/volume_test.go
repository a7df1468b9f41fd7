package client_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/google/uuid"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/volumetest"
)

// TestVolumeDiskActivatesWithReconciliationThenTheDiskGuestPasses runs
// the disk guest on a volume of three real downstairs whose replicas
// disagree: while one replica is down the instance is starting with the
// disk activating and its progress published; once it is back activation
// reconciles them, the vCPUs start, and the guest writes and verifies its
// pattern through the upstairs.
func TestVolumeDiskActivatesWithReconciliationThenTheDiskGuestPasses(t *testing.T) {
	spec := extent.Spec{UUID: uuid.New(), BlockSize: 512, ExtentBlocks: 128, ExtentCount: 8, FormatVersion: extent.FormatVersion1}
	cluster, err := volumetest.NewCluster(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	// Replica 2 holds blocks the others lack, flushed at a later
	// generation: activation must copy them to replicas 0 and 1.
	r, err := extent.Open(cluster.RegionDir(2))
	if err != nil {
		t.Fatal(err)
	}
	blocks := []uint64{3, 200, 900}
	for _, b := range blocks {
		buf := make([]byte, spec.BlockSize)
		for i := range buf {
			buf[i] = byte(b + uint64(i))
		}
		if err := r.WriteBlocks(ids.BlockIndex(b), buf, []uint64{xxhash.Sum64(buf)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Flush(1, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.StartAll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Close() })
	targets := cluster.Targets()
	// Replica 2 is down at first (it keeps its address): activation waits
	// for it up to the quorum wait, so the instance is seen starting.
	if err := cluster.Stop(2); err != nil {
		t.Fatal(err)
	}

	p := startVMM(t, filepath.Join(cluster.Dir, "certs"))
	c, ctx := p.client, ctx(t)
	wait := uint64(60_000)
	is := apiv1.Spec{ID: "disk", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "disk", Params: map[string]uint64{"seed": 42, "sectors": 64}},
		Disks: []apiv1.DiskSpec{{Name: "vol", Backend: apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: targets,
			Region: &apiv1.RegionSpec{BlockSize: 512, ExtentBlocks: 128, ExtentCount: 8}, Gen: 2, QuorumWaitMs: &wait}}},
		Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	if v, err := c.Ensure(ctx, is); err != nil || v.State != apiv1.Creating {
		t.Fatalf("ensure: %+v, %v", v, err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	starting, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Starting })
	if err != nil {
		t.Fatal(err)
	}
	v, err := c.Get(ctx)
	if err != nil || v.State != apiv1.Starting || v.Disks[0].State != apiv1.DiskActivating || v.Disks[0].Activation == nil {
		t.Fatalf("while replica 2 is down: %+v, %v; want starting, the disk activating with progress", v, err)
	}
	if err := cluster.Start(2); err != nil {
		t.Fatal(err)
	}
	var states []apiv1.State
	_, err = c.WaitFor(ctx, starting.Gen, func(s apiv1.View) bool {
		states = append(states, s.State)
		return s.State == apiv1.Destroyed
	})
	if err != nil {
		t.Fatalf("waiting for the guest to finish: %v (states %v)", err, states)
	}
	h, err := c.SerialHistory(ctx, 0, 0)
	if err != nil || !strings.Contains(h.Data, "disk: PASS 64 sectors") {
		t.Fatalf("console %q, %v; want the disk guest's PASS", h.Data, err)
	}
	d, err := c.Disk(ctx, "vol")
	if err != nil {
		t.Fatal(err)
	}
	a := d.Activation
	if a == nil || a.Phase != "done" || a.ExtentsTotal == 0 || a.ExtentsDone != a.ExtentsTotal || a.BytesDone == 0 {
		t.Fatalf("activation %+v; want done after repairing the diverged extents", a)
	}
	// What the guest wrote is on the replicas.
	cluster.Close()
	for i := range 3 {
		r, err := extent.Open(cluster.RegionDir(i))
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 512)
		h := make([]uint64, 1)
		if err := r.ReadBlocks(5, buf, h); err != nil {
			t.Fatal(err)
		}
		r.Close()
		if string(buf) != string(guests.DiskPattern(42, 5)) {
			t.Fatalf("replica %d sector 5 does not hold the guest's pattern", i)
		}
	}
}

// TestAFileDiskAndAVolumeDiskEachGetTheirOwnDevice ensures an instance
// with a file disk and a volume disk and runs the disk guest on the
// volume (params.device 1): the volume is activated on its own while the
// file is ready at once, both are listed and answer on their routes, the
// pattern reaches the three replicas and the file stays untouched.
func TestAFileDiskAndAVolumeDiskEachGetTheirOwnDevice(t *testing.T) {
	spec := extent.Spec{UUID: uuid.New(), BlockSize: 512, ExtentBlocks: 128, ExtentCount: 4, FormatVersion: extent.FormatVersion1}
	cluster, err := volumetest.NewCluster(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.StartAll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Close() })
	file := filepath.Join(t.TempDir(), "scratch.img")
	if err := os.WriteFile(file, make([]byte, 128<<10), 0o644); err != nil {
		t.Fatal(err)
	}

	p := startVMM(t, filepath.Join(cluster.Dir, "certs"))
	c, ctx := p.client, ctx(t)
	is := apiv1.Spec{ID: "file-and-volume", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "disk", Params: map[string]uint64{"seed": 9, "sectors": 16, "device": 1}},
		Disks: []apiv1.DiskSpec{
			{Name: "scratch", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}},
			{Name: "vol", Backend: apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: cluster.Targets(),
				Region: &apiv1.RegionSpec{BlockSize: 512, ExtentBlocks: 128, ExtentCount: 4}, Gen: 1}},
		},
		Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	if _, err := c.Ensure(ctx, is); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
		t.Fatalf("waiting for the guest to finish: %v", err)
	}
	h, err := c.SerialHistory(ctx, 0, 0)
	if err != nil || !strings.Contains(h.Data, "disk: PASS 16 sectors") {
		t.Fatalf("console %q, %v; want the disk guest's PASS", h.Data, err)
	}
	v, err := c.Get(ctx)
	if err != nil || len(v.Disks) != 2 {
		t.Fatalf("instance %+v, %v; want two disks", v, err)
	}
	if d := v.Disks[0]; d.Name != "scratch" || d.Kind != apiv1.BackendFile || d.Activation != nil {
		t.Errorf("disks[0] %+v; want the file disk, without activation", d)
	}
	if d := v.Disks[1]; d.Name != "vol" || d.Kind != apiv1.BackendVolume || d.Activation == nil || d.Activation.Phase != "done" {
		t.Errorf("disks[1] %+v; want the volume, its activation done", d)
	}
	if d, err := c.Disk(ctx, "vol"); err != nil || len(d.Replicas) != 3 {
		t.Errorf("GET disks/vol: %+v, %v; want its three replicas", d, err)
	}
	if got, err := os.ReadFile(file); err != nil || bytes.Count(got, []byte{0}) != len(got) {
		t.Errorf("the file disk was written (%v): the guest used the wrong device", err)
	}
	cluster.Close()
	for i := range 3 {
		r, err := extent.Open(cluster.RegionDir(i))
		if err != nil {
			t.Fatal(err)
		}
		buf, hash := make([]byte, 512), make([]uint64, 1)
		err = r.ReadBlocks(3, buf, hash)
		r.Close()
		if err != nil || !bytes.Equal(buf, guests.DiskPattern(9, 3)) {
			t.Fatalf("replica %d sector 3: %v; want the guest's pattern", i, err)
		}
	}
}

// TestDiskShowsEachReplicasLiveRepairWhileItRuns runs the demo guest on a
// volume of three downstairs; one of them stops and comes back with an
// unflushed write, as after a crash (it may have lost writes, so it is
// live-repaired, not replayed). GET /v1/instance/disks/{name} shows that
// replica's repair progress while the repair runs (phase live_repair,
// extents still to do, the same progress object activation reports) and
// done once the replica is active again, the others with none.
func TestDiskShowsEachReplicasLiveRepairWhileItRuns(t *testing.T) {
	// 2048 extents: a live repair visits each (versions and hashes from
	// two replicas), about a second on /dev/kvm, long beside the few
	// milliseconds between two reads of the disk's status. In the
	// emulated host one extent costs tens of milliseconds (QUIC's crypto
	// and the race detector under TCG), so 256 are as long there, and
	// the whole test gets its deadline scaled.
	extents := kvmtest.Sized(uint32(2048), 256)
	spec := extent.Spec{UUID: uuid.New(), BlockSize: 512, ExtentBlocks: 64, ExtentCount: extents, FormatVersion: extent.FormatVersion1}
	cluster, err := volumetest.NewCluster(t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := cluster.StartAll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cluster.Close() })
	p := startVMM(t, filepath.Join(cluster.Dir, "certs"))
	ctx, cancel := context.WithTimeout(t.Context(), kvmtest.Sized(generous, 4*generous))
	defer cancel()
	c := p.client
	wait := uint64(60_000)
	is := apiv1.Spec{ID: "demo", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "demo"},
		Disks: []apiv1.DiskSpec{{Name: "vol", Backend: apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: cluster.Targets(),
			Region: &apiv1.RegionSpec{BlockSize: 512, ExtentBlocks: 64, ExtentCount: extents}, Gen: 1, QuorumWaitMs: &wait}}},
		Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	if _, err := c.Ensure(ctx, is); err != nil {
		t.Fatal(err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Running }); err != nil {
		t.Fatal(err)
	}
	const back = 2
	waitDisk(t, ctx, c, "every replica active", func(d apiv1.DiskStatus) bool {
		return len(d.Replicas) == 3 && d.Replicas[0].State == "active" && d.Replicas[1].State == "active" && d.Replicas[back].State == "active"
	})
	if err := cluster.Stop(back); err != nil {
		t.Fatal(err)
	}
	waitDisk(t, ctx, c, "the stopped replica out of service", func(d apiv1.DiskStatus) bool {
		return d.Replicas[back].State != "active"
	})
	// A write its downstairs never flushed, as a crash leaves it: the
	// region opens saying it may have lost writes, so the upstairs
	// repairs the replica rather than replaying its backlog.
	r0, err := extent.Open(cluster.RegionDir(back))
	if err != nil {
		t.Fatal(err)
	}
	torn := bytes.Repeat([]byte{0xee}, int(spec.BlockSize))
	if err := r0.WriteBlocks(7, torn, []uint64{xxhash.Sum64(torn)}); err != nil {
		t.Fatal(err)
	}
	if err := r0.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cluster.Start(back); err != nil {
		t.Fatal(err)
	}
	running := waitDisk(t, ctx, c, "the live repair seen running", func(d apiv1.DiskStatus) bool {
		r := d.Replicas[back].Repair
		return r != nil && r.Phase == apiv1.RepairLiveRepair && r.ExtentsDone < r.ExtentsTotal
	})
	r := running.Replicas[back]
	if r.State != "repairing" || r.Repair.ExtentsTotal != uint64(spec.ExtentCount) || r.Repair.StartedAt.IsZero() {
		t.Fatalf("replica %d during its live repair: %+v, progress %+v; want repairing, %d extents to visit, a start time",
			back, r, *r.Repair, spec.ExtentCount)
	}
	t.Logf("live repair running: %+v", *r.Repair)
	done := waitDisk(t, ctx, c, "the repaired replica active", func(d apiv1.DiskStatus) bool {
		return d.Replicas[back].State == "active" && d.Replicas[back].Repair != nil && d.Replicas[back].Repair.Phase.Terminal()
	})
	rp := done.Replicas[back].Repair
	if rp.Phase != apiv1.RepairDone || rp.ExtentsDone != rp.ExtentsTotal || rp.EtaSeconds != 0 {
		t.Fatalf("the finished live repair shows %+v; want done with every extent visited", *rp)
	}
	t.Logf("live repair of %d extents took %v", rp.ExtentsTotal, rp.UpdatedAt.Sub(rp.StartedAt))
	for i, rep := range done.Replicas {
		if i != back && rep.Repair != nil {
			t.Errorf("replica %d, never repaired, shows a repair %+v", i, *rep.Repair)
		}
	}
}

// waitDisk reads GET /v1/instance/disks/vol until cond holds (the API has
// no watch for a disk: each read is a fresh snapshot, and the pause
// between reads is short beside a live repair of hundreds of extents).
func waitDisk(t *testing.T, ctx context.Context, c *client.Client, what string, cond func(apiv1.DiskStatus) bool) apiv1.DiskStatus {
	t.Helper()
	// Each read of the status costs the emulated host's CPU what the
	// volume needs: there, ten times fewer.
	tick := time.NewTicker(kvmtest.Sized(5*time.Millisecond, 50*time.Millisecond))
	defer tick.Stop()
	var last apiv1.DiskStatus
	for {
		d, err := c.Disk(ctx, "vol")
		if err != nil {
			t.Fatalf("waiting for %s: %v (last %+v)", what, err, last)
		}
		if cond(d) {
			return d
		}
		last = d
		select {
		case <-tick.C:
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s: last %+v", what, last)
		}
	}
}
