package vmmruntest

import (
	"bytes"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/google/uuid"

	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/volume/extent"
)

// TestVMMRunDiskGuestOnAThreeReplicaVolume runs the disk guest on a volume
// served by three downstairs processes, then reads each replica's region
// from its files: all three hold the guest's pattern.
func TestVMMRunDiskGuestOnAThreeReplicaVolume(t *testing.T) {
	kvmtest.Require(t)
	base := t.TempDir()
	certs := filepath.Join(base, "certs")
	if _, stderr, code := run(t, "", "certs", "init", "--dir", certs); code != 0 {
		t.Fatalf("certs init: %s", stderr)
	}
	id := uuid.NewString()
	var dirs [3]string
	var procs [3]*kvmtest.Downstairs
	var addrs []string
	for i := range dirs {
		dirs[i] = filepath.Join(base, "r"+strconv.Itoa(i))
		if _, stderr, code := run(t, "", "downstairs", "create", "--dir", dirs[i], "--uuid", id,
			"--block-size", "512", "--extent-size", "1MiB", "--extent-count", "4"); code != 0 {
			t.Fatalf("downstairs create: %s", stderr)
		}
		procs[i] = kvmtest.StartDownstairs(t, dirs[i], certs)
		addrs = append(addrs, procs[i].Addr)
	}
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "disk",
		"--disk", "volume:"+strings.Join(addrs, ","), "--certs", certs, "--gen", "1")
	if code != 0 || !strings.Contains(stdout, "disk: PASS 256 sectors") {
		t.Fatalf("exit status %d; stdout %q; stderr %q", code, stdout, stderr)
	}
	for i, p := range procs {
		p.Stop()
		region, err := extent.Open(dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 256*512)
		err = region.ReadBlocks(0, got, make([]uint64, 256))
		region.Close()
		if err != nil {
			t.Fatalf("reading replica %d: %v", i, err)
		}
		for s := uint64(0); s < 256; s++ {
			if !bytes.Equal(got[s*512:(s+1)*512], guests.DiskPattern(guests.DefaultDiskSeed, s)) {
				t.Fatalf("replica %d: sector %d does not hold the disk guest's pattern", i, s)
			}
		}
	}
}

// TestVMMRunDiskGuestOnAnErasureCodedVolume runs the disk guest on a 2+1
// erasure-coded volume of three downstairs processes (--layout ec:2+1):
// the guest writes and verifies its pattern through the stripes, and
// sector s is on data shard s mod 2 at block s / 2.
func TestVMMRunDiskGuestOnAnErasureCodedVolume(t *testing.T) {
	kvmtest.Require(t)
	base := t.TempDir()
	certs := filepath.Join(base, "certs")
	if _, stderr, code := run(t, "", "certs", "init", "--dir", certs); code != 0 {
		t.Fatalf("certs init: %s", stderr)
	}
	id := uuid.NewString()
	var dirs [3]string
	var procs [3]*kvmtest.Downstairs
	var addrs []string
	for i := range dirs {
		dirs[i] = filepath.Join(base, "s"+strconv.Itoa(i))
		if _, stderr, code := run(t, "", "downstairs", "create", "--dir", dirs[i], "--uuid", id,
			"--block-size", "512", "--extent-size", "1MiB", "--extent-count", "4"); code != 0 {
			t.Fatalf("downstairs create: %s", stderr)
		}
		procs[i] = kvmtest.StartDownstairs(t, dirs[i], certs)
		addrs = append(addrs, procs[i].Addr)
	}
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "disk", "--layout", "ec:2+1",
		"--disk", "volume:"+strings.Join(addrs, ","), "--certs", certs, "--gen", "1")
	if code != 0 || !strings.Contains(stdout, "disk: PASS 256 sectors") {
		t.Fatalf("exit status %d; stdout %q; stderr %q", code, stdout, stderr)
	}
	for i, p := range procs[:2] {
		p.Stop()
		region, err := extent.Open(dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 128*512)
		err = region.ReadBlocks(0, got, make([]uint64, 128))
		region.Close()
		if err != nil {
			t.Fatalf("reading shard %d: %v", i, err)
		}
		for b := uint64(0); b < 128; b++ {
			if !bytes.Equal(got[b*512:(b+1)*512], guests.DiskPattern(guests.DefaultDiskSeed, 2*b+uint64(i))) {
				t.Fatalf("shard %d: block %d does not hold sector %d of the disk guest's pattern", i, b, 2*b+uint64(i))
			}
		}
	}
}
