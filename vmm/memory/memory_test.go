package memory

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func newTestMemory(t *testing.T) *Memory {
	t.Helper()
	m, err := New(
		RegionSpec{Name: "high", Base: 0x100000, Size: 64 * PageSize},
		RegionSpec{Name: "low", Base: 0, Size: 16 * PageSize},
		RegionSpec{Name: "adjacent", Base: 0x100000 + 64*PageSize, Size: 4 * PageSize},
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestSliceIsTheSharedMappingOfTheMemfd(t *testing.T) {
	m := newTestMemory(t)
	s, err := m.Slice(0x100000+5*PageSize+7, 5)
	if err != nil {
		t.Fatal(err)
	}
	copy(s, "tern!")
	high := m.Regions()[1]
	if high.Name() != "high" {
		t.Fatalf("regions not sorted by base: %v", high.Name())
	}
	// A second, independent mapping of the memfd sees the bytes: the
	// region is MAP_SHARED memory that KVM or another process can map.
	other, err := unix.Mmap(high.Fd(), 0, int(high.Size()), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(other)
	if got := string(other[5*PageSize+7 : 5*PageSize+12]); got != "tern!" {
		t.Errorf("other mapping reads %q", got)
	}
	if got := string(high.Bytes()[5*PageSize+7 : 5*PageSize+12]); got != "tern!" {
		t.Errorf("Region.Bytes reads %q", got)
	}
	if cap(s) != 5 {
		t.Errorf("slice cap %d, want 5 so append cannot reach past the range", cap(s))
	}
}

func TestTypedAccessorsTranslateAcrossRegions(t *testing.T) {
	m := newTestMemory(t)
	cases := []struct {
		gpa GPA
		v   uint64
	}{{0x10, 0x0102030405060708}, {0x100000 + 64*PageSize + 8, 0xdeadbeefcafef00d}, {0x100ff8, 42}}
	for _, c := range cases {
		if err := m.PutUint64(c.gpa, c.v); err != nil {
			t.Fatal(err)
		}
		if got, err := m.Uint64(c.gpa); err != nil || got != c.v {
			t.Errorf("Uint64(%#x) = %#x, %v; want %#x", uint64(c.gpa), got, err, c.v)
		}
	}
	if b, _ := m.Uint8(0x10); b != 0x08 {
		t.Errorf("little-endian low byte %#x", b)
	}
	if v, _ := m.Uint32(0x14); v != 0x01020304 {
		t.Errorf("Uint32 = %#x", v)
	}
	if v, _ := m.Uint16(0x12); v != 0x0506 {
		t.Errorf("Uint16 = %#x", v)
	}
	if m.Size() != (64+16+4)*PageSize {
		t.Errorf("Size = %d", m.Size())
	}
}

func TestOutOfRangeAccessesReturnErrors(t *testing.T) {
	m := newTestMemory(t)
	cases := []struct {
		name string
		gpa  GPA
		n    uint64
	}{
		{"in the gap between regions", 16 * PageSize, 1},
		{"straddles the end of a region into the gap", 16*PageSize - 4, 8},
		{"straddles two adjacent regions", 0x100000 + 64*PageSize - 4, 8},
		{"past the last region", 0x100000 + 68*PageSize, 1},
		{"huge length", 0, ^uint64(0)},
		{"address near the top", ^GPA(0) - 2, 8},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := m.Slice(c.gpa, c.n); !errors.Is(err, ErrOutOfRange) {
				t.Errorf("Slice error %v, want ErrOutOfRange", err)
			}
			if err := m.Write(c.gpa, make([]byte, min(c.n, 16))); c.n <= 16 && !errors.Is(err, ErrOutOfRange) {
				t.Errorf("Write error %v, want ErrOutOfRange", err)
			}
			if m.Contains(c.gpa, c.n) {
				t.Error("Contains reports true")
			}
		})
	}
	if _, err := m.Slice(0x100000+64*PageSize, 4*PageSize); err != nil {
		t.Errorf("a whole region: %v", err)
	}
	if _, err := m.Slice(16*PageSize, 0); err != nil {
		t.Errorf("an empty slice at a region's end: %v", err)
	}
}

func TestNewReportsEverySpecProblemAtOnce(t *testing.T) {
	_, err := New(
		RegionSpec{Name: "ram", Base: 0, Size: 1 << 20},
		RegionSpec{Name: "overlapping", Base: 0x80000, Size: 1 << 20},
		RegionSpec{Name: "zero", Base: 0x1000000, Size: 0},
		RegionSpec{Name: "odd", Base: 0x2000001, Size: 100},
		RegionSpec{Name: "ram", Base: 0x3000000, Size: PageSize},
		RegionSpec{Name: "huge", Base: 0x4001000, Size: PageSize, HugeTLB: true},
	)
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("error %v, want ErrInvalidSpec", err)
	}
	msg := err.Error()
	for _, want := range []string{
		`region "ram" [0x0, 0x100000) overlaps region "overlapping" [0x80000, 0x180000)`,
		`region "zero" [0x1000000, 0x1000000): zero size`,
		`"odd" [0x2000001, 0x2000065): size 100 is not a multiple of 4096`,
		`"odd" [0x2000001, 0x2000065): base is not 4096-aligned`,
		`duplicate name`,
		`"huge" [0x4001000, 0x4002000): size 4096 is not a multiple of 2097152`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if _, err := New(); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("no regions: %v", err)
	}
}

func TestCloseUnmapsAndClosesTheMemfd(t *testing.T) {
	m, err := New(RegionSpec{Name: "ram", Size: PageSize})
	if err != nil {
		t.Fatal(err)
	}
	fd := m.Regions()[0].Fd()
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("fd %d still open after Close (fcntl: %v)", fd, err)
	}
	if _, err := m.Slice(0, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("Slice after Close: %v, want ErrClosed", err)
	}
}

func TestWritesMarkDirtyPagesAndTakeClears(t *testing.T) {
	m := newTestMemory(t)
	if err := m.Write(0x100000+PageSize-2, []byte{1, 2, 3, 4}); err != nil { // pages 0 and 1
		t.Fatal(err)
	}
	if err := m.PutUint32(0x100000+10*PageSize, 7); err != nil {
		t.Fatal(err)
	}
	d := m.Regions()[1].Dirty()
	if got := DirtyPages(d.Take()); !slices.Equal(got, []uint64{0, 1, 10}) {
		t.Errorf("dirty pages %v, want [0 1 10]", got)
	}
	if d.Count() != 0 {
		t.Errorf("%d pages still dirty after Take", d.Count())
	}
	if m.Regions()[0].Dirty().Count() != 0 {
		t.Error("another region got marked")
	}
	if err := m.MarkDirty(16*PageSize, 1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("MarkDirty outside RAM: %v", err)
	}
}

func TestMergeKVMORsBitmapsAndMasksTheTail(t *testing.T) {
	d := NewDirtyBitmap(70)
	d.Mark(3)
	if err := d.MergeKVM([]uint64{1 << 5, 1<<2 | 1<<40}); err != nil {
		t.Fatal(err)
	}
	if got := DirtyPages(d.Take()); !slices.Equal(got, []uint64{3, 5, 66}) {
		t.Errorf("pages %v, want [3 5 66] (bit 104 is past the region)", got)
	}
	if err := d.MergeKVM(make([]uint64, 3)); err == nil {
		t.Error("a bitmap of the wrong length was accepted")
	}
	d.MarkRange(69*PageSize, 10*PageSize) // clipped at the end
	d.Mark(1000)                          // ignored
	if got := DirtyPages(d.Take()); !slices.Equal(got, []uint64{69}) {
		t.Errorf("pages %v, want [69]", got)
	}
}

func TestAtomicUint16KeepsTheOtherHalfOfItsWord(t *testing.T) {
	m := newTestMemory(t)
	if err := m.PutUint32(0x100, 0xaaaabbbb); err != nil {
		t.Fatal(err)
	}
	if err := m.AtomicPutUint16(0x102, 0x1234); err != nil {
		t.Fatal(err)
	}
	if v, _ := m.AtomicUint32(0x100); v != 0x1234bbbb {
		t.Errorf("word %#x, want 0x1234bbbb", v)
	}
	if v, _ := m.AtomicUint16(0x100); v != 0xbbbb {
		t.Errorf("low half %#x", v)
	}
	if _, err := m.AtomicUint16(0x101); !errors.Is(err, ErrMisaligned) {
		t.Errorf("odd address: %v", err)
	}
	if err := m.AtomicPutUint32(0x102, 1); !errors.Is(err, ErrMisaligned) {
		t.Errorf("2-aligned uint32: %v", err)
	}
	if _, err := m.AtomicUint16(16 * PageSize); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("outside RAM: %v", err)
	}
}

func TestConcurrentAtomicHalvesDoNotLoseUpdates(t *testing.T) {
	m := newTestMemory(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 5000 {
			m.AtomicPutUint16(0x200, uint16(i))
		}
	}()
	for i := range 5000 {
		m.AtomicPutUint16(0x202, uint16(i))
	}
	<-done
	if v, _ := m.AtomicUint32(0x200); v != 4999<<16|4999 {
		t.Errorf("word %#x, want both halves 4999", v)
	}
}

func TestHugeTLBRegion(t *testing.T) {
	m, err := New(RegionSpec{Name: "huge", Size: HugePageSize, HugeTLB: true})
	if err != nil {
		t.Skipf("no 2 MiB huge pages available on this host: %v", err)
	}
	defer m.Close()
	s, err := m.Slice(HugePageSize-3, 3)
	if err != nil {
		t.Fatal(err)
	}
	copy(s, "end")
	if !bytes.Equal(m.Regions()[0].Bytes()[HugePageSize-3:], []byte("end")) {
		t.Error("write not visible")
	}
}
