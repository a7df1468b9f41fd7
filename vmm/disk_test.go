package vmm_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"tern/internal/blockio"
	"tern/vmm"
	"tern/vmm/devices"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
)

// recordingBackend wraps a backend and records the buffers it was handed
// and the flushes.
type recordingBackend struct {
	blockio.Device
	mu      sync.Mutex
	buffers [][2]uintptr // [start, end) of every ReadAt/WriteAt buffer
	flushes int
}

func (b *recordingBackend) record(p []byte) {
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	b.mu.Lock()
	b.buffers = append(b.buffers, [2]uintptr{start, start + uintptr(len(p))})
	b.mu.Unlock()
}

func (b *recordingBackend) ReadAt(ctx context.Context, p []byte, off int64) (int, error) {
	b.record(p)
	return b.Device.ReadAt(ctx, p, off)
}

func (b *recordingBackend) WriteAt(ctx context.Context, p []byte, off int64) (int, error) {
	b.record(p)
	return b.Device.WriteAt(ctx, p, off)
}

func (b *recordingBackend) Flush(ctx context.Context) error {
	b.mu.Lock()
	b.flushes++
	b.mu.Unlock()
	return b.Device.Flush(ctx)
}

func TestDiskGuestPassesOnAFileAndTheFileHoldsItsPattern(t *testing.T) {
	kvmtest.Require(t)
	const sectors = 256
	path := filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(path, make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	file, err := devices.OpenFileBackend(path, 512)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	disk := &recordingBackend{Device: file}
	vm := newVM(t, vmm.Config{Guest: "disk", Disk: disk, Params: &guests.Params{Sectors: sectors}})
	con := newConsole(t, vm)
	r := wait(t, start(t, vm))
	if r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0, nil; console %q", r.status, r.err, con.seen)
	}
	con.waitLine(fmt.Sprintf("disk: PASS %d sectors", sectors))

	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for s := uint64(0); s < sectors; s++ {
		if want := guests.DiskPattern(guests.DefaultDiskSeed, s); !bytes.Equal(got[s*512:(s+1)*512], want) {
			t.Fatalf("sector %d of the file does not hold the disk guest's pattern", s)
		}
	}
	disk.mu.Lock()
	defer disk.mu.Unlock()
	if disk.flushes == 0 {
		t.Error("the guest's FLUSH never reached the backend")
	}
	ram := vm.Memory().Regions()[0].Bytes()
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(ram)))
	hi := lo + uintptr(len(ram))
	if len(disk.buffers) == 0 {
		t.Fatal("the backend saw no IO")
	}
	for _, b := range disk.buffers {
		if b[0] < lo || b[1] > hi {
			t.Fatalf("a backend buffer [%#x, %#x) lies outside guest RAM [%#x, %#x): not in place", b[0], b[1], lo, hi)
		}
	}
}

func TestEchoGuestEchoesWhatIsTypedToTheUART(t *testing.T) {
	kvmtest.Require(t)
	vm := newVM(t, vmm.Config{Guest: "echo"})
	con := newConsole(t, vm)
	done := start(t, vm)
	con.waitLine(guests.EchoReady)
	vm.Serial().Input([]byte("hello tern\r\n"))
	con.waitLine("echo: hello tern")
	vm.Serial().Input([]byte("quit\n"))
	con.waitLine(guests.EchoBye)
	if r := wait(t, done); r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0, nil", r.status, r.err)
	}
	if strings.Contains(strings.Join(con.seen, "\n"), guests.ExceptionPrefix) {
		t.Errorf("the guest took an exception: %q", con.seen)
	}
}

// TestEachDiskIsItsOwnDevice gives the VM three disks and points the disk
// guest at the second (its parameter block's VirtioBase): the guest
// passes on it, which only its pattern in the second file and nothing in
// the others proves went to the right device.
func TestEachDiskIsItsOwnDevice(t *testing.T) {
	kvmtest.Require(t)
	const sectors = 64
	dir := t.TempDir()
	var paths []string
	var disks []blockio.Device
	for i := range 3 {
		p := filepath.Join(dir, fmt.Sprintf("disk%d.img", i))
		if err := os.WriteFile(p, make([]byte, 256<<10), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := devices.OpenFileBackend(p, 512)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		paths, disks = append(paths, p), append(disks, f)
	}
	vm := newVM(t, vmm.Config{Guest: "disk", Disks: disks,
		Params: &guests.Params{Sectors: sectors, VirtioBase: vmm.VirtioBlkAddr(1)}})
	con := newConsole(t, vm)
	r := wait(t, start(t, vm))
	if r.err != nil || r.status != 0 {
		t.Fatalf("Run = %d, %v; want 0, nil; console %q", r.status, r.err, con.seen)
	}
	con.waitLine(fmt.Sprintf("disk: PASS %d sectors", sectors))
	for i, p := range paths {
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		written := bytes.Equal(got[:512], guests.DiskPattern(guests.DefaultDiskSeed, 0))
		if zero := bytes.Count(got, []byte{0}) == len(got); written == (i != 1) || !written && !zero {
			t.Errorf("disk %d: pattern written %v, all zero %v; want the pattern on disk 1 only", i, written, zero)
		}
	}
}
