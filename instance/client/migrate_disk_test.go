package client_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"tern/instance/apiv1"
	"tern/internal/kvmhost"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/volume/extent"
)

// diskPasses is how many write-and-verify passes the disk guest makes in
// the migration tests: enough that the migration lands in the middle of
// them, few enough that the guest then ends on the target. On a volume
// inside the emulated test host a pass (a round trip to three replicas
// per request) is about as long as the whole migration, so there fewer
// do.
func diskPasses(volume bool) uint64 {
	if volume && kvmhost.InsideEmulatedHost() {
		return 30
	}
	return 300
}

// diskSectors is what each pass writes and verifies.
const diskSectors = 256

// diskGuestSpec is the disk guest making passes passes over
// disks[device].
func diskGuestSpec(id string, disks []apiv1.DiskSpec, device, passes uint64) apiv1.Spec {
	return apiv1.Spec{ID: id, Name: "disk", VCPUs: 1, MemoryMiB: 32,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "disk", Params: map[string]uint64{
			"seed": 7, "sectors": diskSectors, "passes": passes, "device": device}},
		Disks: disks,
		Init:  apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
}

// diskPass parses "disk: PASS N sectors pass K".
func diskPass(line string) (pass uint64, ok bool) {
	var n uint64
	_, err := fmt.Sscanf(line, "disk: PASS %d sectors pass %d", &n, &pass)
	return pass, err == nil && n == diskSectors
}

// waitDiskPass waits for the disk guest's next pass, which must pass.
func (w *consoleWatch) waitDiskPass(t *testing.T, what string) uint64 {
	t.Helper()
	c := ctx(t)
	for {
		line, err := w.next(c)
		if err != nil {
			t.Fatalf("waiting for a disk pass %s: %v (console %q)", what, err, w.seen)
		}
		if strings.HasPrefix(line, "disk: FAIL") {
			t.Fatalf("disk guest %s: %s", what, line)
		}
		if p, ok := diskPass(line); ok {
			return p
		}
	}
}

// migrateDiskGuest runs the disk guest on src over disks[device],
// migrates it in the middle of its passes to dst, and waits for the guest
// to make its last pass on the target and the target to end destroyed.
func migrateDiskGuest(t *testing.T, src, dst *vmmProc, disks []apiv1.DiskSpec, device, passes uint64) {
	t.Helper()
	c := ctx(t)
	if _, err := src.client.Ensure(c, diskGuestSpec("disk-mig", disks, device, passes)); err != nil {
		t.Fatal(err)
	}
	if err := src.client.RequestState(c, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	first := watchConsole(t, src.client, 0).waitDiskPass(t, "on the source")
	spec := targetSpec("disk-mig", migrationAddr(t, src), "m-disk")
	migrateAndCheck(t, src, dst, spec, &history{t: t, name: "source"}, func(w *consoleWatch) string {
		next := w.waitDiskPass(t, "on the target")
		if next <= first {
			t.Fatalf("the target's first pass is %d; the source had made %d", next, first)
		}
		last := next
		for last < passes-1 {
			last = w.waitDiskPass(t, "on the target")
		}
		return fmt.Sprintf("passes %d on the source, %d to %d on the target", first, next, last)
	})
	dstSeen := &history{t: t, name: "target"}
	dstSeen.waitFor(dst.client, "destroyed once the guest exits", func(s apiv1.View) bool { return s.State == apiv1.Destroyed })
}

// checkDiskPattern checks that got, the disk's first diskSectors
// sectors, holds the pattern of the disk guest's last of passes.
func checkDiskPattern(t *testing.T, what string, got []byte, passes uint64) {
	t.Helper()
	for s := uint64(0); s < diskSectors; s++ {
		if !bytes.Equal(got[s*512:(s+1)*512], guests.DiskPattern(7+passes-1, s)) {
			t.Fatalf("%s: sector %d does not hold the disk guest's last pattern", what, s)
		}
	}
}

// TestMigrateDiskGuestWithAFileDisk migrates the disk guest, in the
// middle of its passes, with its file disk: its passes go on verifying on
// the target, and the file holds its last pattern.
func TestMigrateDiskGuestWithAFileDisk(t *testing.T) {
	src := startVMM(t, "")
	dst := startVMM(t, src.certs)
	file := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	disk := apiv1.DiskSpec{Name: "vda", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}}
	passes := diskPasses(false)
	migrateDiskGuest(t, src, dst, []apiv1.DiskSpec{disk}, 0, passes)
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	checkDiskPattern(t, "the file", got, passes)
}

// TestMigrateDiskGuestWithAVolumeDisk migrates the disk guest, in the
// middle of its passes, with two disks: a file, and the volume of three
// `tern downstairs` processes it tests. The target activates the volume
// at the source's generation + 1 once the source paused and flushed, the
// passes go on verifying there, and every replica holds the guest's last
// pattern.
func TestMigrateDiskGuestWithAVolumeDisk(t *testing.T) {
	kvmtest.Require(t)
	base := t.TempDir()
	certs, dirs, procs, addrs := startDownstairsProcs(t, base, "--block-size", "512", "--extent-size", "64KiB", "--extent-count", "4")
	src := startVMM(t, certs)
	dst := startVMM(t, certs)
	wait := uint64(60_000)
	file := filepath.Join(base, "other.img")
	if err := os.WriteFile(file, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	disks := []apiv1.DiskSpec{
		{Name: "vda", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: file}},
		{Name: "vol", Backend: apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: addrs,
			Region: &apiv1.RegionSpec{BlockSize: 512, ExtentBlocks: 128, ExtentCount: 4}, Gen: 2, QuorumWaitMs: &wait}},
	}
	passes := diskPasses(true)
	migrateDiskGuest(t, src, dst, disks, 1, passes)
	v, err := dst.client.Get(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(v.Spec.Disks) != 2 || v.Spec.Disks[1].Backend.Gen != 3 {
		t.Fatalf("the target's disks %+v; want the volume at the source's generation 2 + 1", v.Spec.Disks)
	}
	for i, p := range procs {
		p.Stop()
		region, err := extent.Open(dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, diskSectors*512)
		err = region.ReadBlocks(0, got, make([]uint64, diskSectors))
		region.Close()
		if err != nil {
			t.Fatalf("reading replica %d: %v", i, err)
		}
		checkDiskPattern(t, fmt.Sprintf("replica %d", i), got, passes)
	}
}

// startDownstairsProcs makes certificates and three regions of one UUID
// under base (`tern certs init`, `tern downstairs create` with
// createArgs) and serves each with a `tern downstairs run` process.
func startDownstairsProcs(t *testing.T, base string, createArgs ...string) (certs string, dirs [3]string, procs [3]*kvmtest.Downstairs, addrs []string) {
	t.Helper()
	certs = filepath.Join(base, "certs")
	if _, stderr, code := runTern(t, "certs", "init", "--dir", certs); code != 0 {
		t.Fatalf("certs init: %s", stderr)
	}
	id := uuid.NewString()
	for i := range dirs {
		dirs[i] = filepath.Join(base, "r"+strconv.Itoa(i))
		args := append([]string{"downstairs", "create", "--dir", dirs[i], "--uuid", id}, createArgs...)
		if _, stderr, code := runTern(t, args...); code != 0 {
			t.Fatalf("downstairs create: %s", stderr)
		}
		procs[i] = kvmtest.StartDownstairs(t, dirs[i], certs)
		addrs = append(addrs, procs[i].Addr)
	}
	return certs, dirs, procs, addrs
}
