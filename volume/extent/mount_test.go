package extent

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"tern/volume/ids"
	"testing"

	"golang.org/x/sys/unix"
)

// mountTmpfs mounts a tmpfs of the given size (mount(8) syntax, e.g.
// "256k") on a fresh directory and unmounts it when the test ends; it
// skips the test where mount(2) is not permitted.
func mountTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("skipping: mount(2) of a tmpfs is not permitted here (%v); run as root", err)
		}
		t.Fatalf("mount tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() { unmount(t, dir) })
	return dir
}

// bindReadOnly bind-mounts src on a fresh directory and makes the bind
// read-only; it skips where mount(2) is not permitted.
func bindReadOnly(t *testing.T, src string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount(src, dir, "", unix.MS_BIND, ""); err != nil {
		if errors.Is(err, unix.EPERM) {
			t.Skipf("skipping: bind mount is not permitted here (%v); run as root", err)
		}
		t.Fatalf("bind mount %s on %s: %v", src, dir, err)
	}
	t.Cleanup(func() { unmount(t, dir) })
	if err := unix.Mount("", dir, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY, ""); err != nil {
		t.Fatalf("remount %s read-only: %v", dir, err)
	}
	return dir
}

func unmount(t *testing.T, dir string) {
	if err := unix.Unmount(dir, 0); err != nil {
		// Never leave a mount behind, even if something still holds it.
		unix.Unmount(dir, unix.MNT_DETACH)
		t.Errorf("unmount %s: %v", dir, err)
	}
}

func TestWriteOnFullFilesystemFailsWithErrNoSpaceAndFlushedDataSurvives(t *testing.T) {
	const bs = 4096
	mnt := mountTmpfs(t, "256k")
	r := createRegionIn(t, filepath.Join(mnt, "region"), testSpec(bs, 16, 8)) // 512 KiB
	flushed := pattern(50, 16, bs)
	mustWrite(t, r, 0, flushed)
	if err := r.Flush(1, 1); err != nil {
		t.Fatal(err)
	}
	var (
		failed ids.BlockIndex
		err    error
	)
	for e := ids.BlockIndex(1); e < 8; e++ {
		p := pattern(uint64(50+e), 16, bs)
		if err = r.WriteBlocks(e*16, p, hashesOf(p, bs)); err != nil {
			failed = e * 16
			break
		}
	}
	if !errors.Is(err, ErrNoSpace) || !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("filling a 256 KiB tmpfs: err = %v, want ErrNoSpace wrapping ENOSPC", err)
	}
	t.Logf("write at block %d: %v", failed, err)
	if got := mustRead(t, r, 0, 16); !bytes.Equal(got, flushed) {
		t.Fatal("flushed data changed after ENOSPC")
	}
	// The failed write's blocks are not served until rewritten.
	if _, err := readChecked(r, failed, 1); !errors.Is(err, ErrCorruptBlock) {
		t.Errorf("block %d of the failed write: read = %v, want ErrCorruptBlock", failed, err)
	}
	if err := r.Flush(2, 1); err != nil {
		t.Errorf("Flush after ENOSPC: %v", err)
	}

	r = reopen(t, r)
	if got := mustRead(t, r, 0, 16); !bytes.Equal(got, flushed) {
		t.Fatal("flushed data changed across reopen after ENOSPC")
	}
	want := pattern(uint64(50+failed/16), 16, bs)
	for b := failed; b < failed+16; b++ {
		got, err := readChecked(r, b, 1)
		if errors.Is(err, ErrCorruptBlock) {
			continue
		}
		if err != nil {
			t.Fatalf("block %d: %v", b, err)
		}
		i := int(b - failed)
		if !bytes.Equal(got, make([]byte, bs)) && !bytes.Equal(got, want[i*bs:(i+1)*bs]) {
			t.Fatalf("block %d of the failed write served data never written", b)
		}
	}
}

func TestCreateOnFullFilesystemFailsWithErrNoSpaceAndLeavesNoRegion(t *testing.T) {
	mnt := mountTmpfs(t, "16k")
	dir := filepath.Join(mnt, "region")
	if _, err := Create(dir, testSpec(4096, 16, 64)); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Create on a 16 KiB tmpfs = %v, want ErrNoSpace", err)
	}
	if _, err := Open(dir); !errors.Is(err, ErrNoRegion) {
		t.Errorf("Open after a failed Create = %v, want ErrNoRegion", err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 0 {
		t.Errorf("failed Create left %d files behind", len(left))
	}
}

func TestRegionOnReadOnlyMountServesReadsAndRefusesWritesWithErrReadOnly(t *testing.T) {
	const bs = 512
	mnt := mountTmpfs(t, "1m")
	r := createRegionIn(t, filepath.Join(mnt, "region"), testSpec(bs, 4, 2))
	flushed := pattern(60, 8, bs)
	mustWrite(t, r, 0, flushed)
	if err := r.Flush(1, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.SetHighestGen(3); err != nil {
		t.Fatal(err)
	}
	// Extent 1 is left dirty: it must be verified even read-only.
	p := pattern(61, 1, bs)
	mustWrite(t, r, 5, p)
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}

	ro := bindReadOnly(t, mnt)
	r, err := Open(filepath.Join(ro, "region"))
	if err != nil {
		t.Fatalf("Open on a read-only mount: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	if !r.ReadOnly() {
		t.Error("ReadOnly() = false on a read-only mount")
	}
	want := append(append([]byte{}, flushed[:5*bs]...), p...)
	want = append(want, flushed[6*bs:]...)
	if got := mustRead(t, r, 0, 8); !bytes.Equal(got, want) {
		t.Error("read-only region served different data")
	}
	if g := r.HighestGen(); g != 3 {
		t.Errorf("HighestGen = %d, want 3", g)
	}
	h := hashesOf(p, bs)
	for name, err := range map[string]error{
		"WriteBlocks":   r.WriteBlocks(0, p, h),
		"Flush":         r.Flush(2, 1),
		"SetHighestGen": r.SetHighestGen(4),
		"RepairExtent":  r.RepairExtent(0, []uint32{0}, p, h, Version{}),
	} {
		if !errors.Is(err, ErrReadOnly) {
			t.Errorf("%s on a read-only mount = %v, want ErrReadOnly", name, err)
		}
	}
	if _, err := Create(filepath.Join(ro, "new"), testSpec(bs, 4, 1)); !errors.Is(err, ErrReadOnly) || !errors.Is(err, unix.EROFS) {
		t.Errorf("Create on a read-only mount = %v, want ErrReadOnly wrapping EROFS", err)
	}
}

func TestOSErrorsAreClassifiedForCallers(t *testing.T) {
	for _, tc := range []struct {
		errno unix.Errno
		want  error
	}{
		{unix.EROFS, ErrReadOnly},
		{unix.EACCES, ErrReadOnly},
		{unix.EPERM, ErrReadOnly},
		{unix.ENOSPC, ErrNoSpace},
		{unix.EDQUOT, ErrNoSpace},
	} {
		err := classify(os.NewSyscallError("pwrite", tc.errno))
		if !errors.Is(err, tc.want) || !errors.Is(err, tc.errno) {
			t.Errorf("classify(%v) = %v, want %v and the errno", tc.errno, err, tc.want)
		}
	}
	if err := classify(unix.EIO); errors.Is(err, ErrReadOnly) || errors.Is(err, ErrNoSpace) {
		t.Errorf("classify(EIO) = %v, want it unclassified", err)
	}
}
