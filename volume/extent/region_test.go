package extent

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"tern/volume/ids"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/google/uuid"
)

func TestWriteThenReadReturnsDataAndHashes(t *testing.T) {
	for _, bs := range []uint32{512, 4096} {
		t.Run(fmt.Sprint(bs), func(t *testing.T) {
			r := createRegion(t, testSpec(bs, 8, 4))
			// Spans extents 0, 1 and 2.
			p := pattern(1, 13, bs)
			mustWrite(t, r, 5, p)
			if got := mustRead(t, r, 5, 13); !bytes.Equal(got, p) {
				t.Fatal("read back different data")
			}
			hashes := make([]uint64, 13)
			if err := r.ReadBlocks(5, make([]byte, 13*int(bs)), hashes); err != nil {
				t.Fatal(err)
			}
			for i, h := range hashesOf(p, bs) {
				if hashes[i] != h {
					t.Fatalf("block %d: recorded hash %x, want %x", 5+i, hashes[i], h)
				}
			}
		})
	}
}

func TestNeverWrittenBlocksReadAsZerosWithZeroBlockHash(t *testing.T) {
	r := createRegion(t, testSpec(4096, 8, 2))
	mustWrite(t, r, 3, pattern(2, 1, 4096))
	p := make([]byte, 3*4096)
	for i := range p {
		p[i] = 0xff
	}
	hashes := make([]uint64, 3)
	if err := r.ReadBlocks(8, p, hashes); err != nil {
		t.Fatal(err)
	}
	zero := xxhash.Sum64(make([]byte, 4096))
	for i, h := range hashes {
		if h != zero {
			t.Errorf("block %d: hash %x, want zero-block hash %x", 8+i, h, zero)
		}
	}
	if !bytes.Equal(p, make([]byte, len(p))) {
		t.Error("never-written blocks did not read as zeros")
	}
}

func TestZeroLengthIOIsANoOp(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 2))
	if err := r.WriteBlocks(8, nil, nil); err != nil {
		t.Errorf("WriteBlocks at end, zero length: %v", err)
	}
	if err := r.ReadBlocks(0, nil, nil); err != nil {
		t.Errorf("ReadBlocks zero length: %v", err)
	}
	if v, _ := r.ExtentVersion(0); v.Dirty {
		t.Error("zero-length write dirtied an extent")
	}
}

func TestIOOutsideRegionFailsWithErrOutOfRange(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 2)) // 8 blocks
	for _, tc := range []struct {
		first ids.BlockIndex
		n     int
	}{{8, 1}, {7, 2}, {100, 1}, {^ids.BlockIndex(0), 1}, {^ids.BlockIndex(0) - 1, 3}} {
		p := make([]byte, tc.n*512)
		h := hashesOf(p, 512)
		if err := r.ReadBlocks(tc.first, p, h); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("ReadBlocks(%d, %d blocks) = %v, want ErrOutOfRange", tc.first, tc.n, err)
		}
		if err := r.WriteBlocks(tc.first, p, h); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("WriteBlocks(%d, %d blocks) = %v, want ErrOutOfRange", tc.first, tc.n, err)
		}
	}
	if _, err := r.ExtentVersion(2); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("ExtentVersion(2) = %v, want ErrOutOfRange", err)
	}
}

func TestUnalignedBuffersFailWithErrUnaligned(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 2))
	for _, tc := range []struct {
		name    string
		bytes   int
		nhashes int
	}{
		{"partial block", 511, 1},
		{"block and a half", 768, 1},
		{"more hashes than blocks", 512, 2},
		{"fewer hashes than blocks", 1024, 1},
		{"hashes without data", 0, 1},
	} {
		p := make([]byte, tc.bytes)
		h := make([]uint64, tc.nhashes)
		if err := r.ReadBlocks(0, p, h); !errors.Is(err, ErrUnaligned) {
			t.Errorf("%s: ReadBlocks = %v, want ErrUnaligned", tc.name, err)
		}
		if err := r.WriteBlocks(0, p, h); !errors.Is(err, ErrUnaligned) {
			t.Errorf("%s: WriteBlocks = %v, want ErrUnaligned", tc.name, err)
		}
	}
}

func TestWriteWithWrongHashIsRejectedBeforeWritingAnything(t *testing.T) {
	r := createRegion(t, testSpec(4096, 4, 2))
	old := pattern(3, 6, 4096)
	mustWrite(t, r, 1, old)
	if err := r.Flush(1, 1); err != nil {
		t.Fatal(err)
	}
	p := pattern(4, 6, 4096)
	h := hashesOf(p, 4096)
	h[5] ^= 1 // last block, in the second extent
	err := r.WriteBlocks(1, p, h)
	var be *BlockError
	if !errors.Is(err, ErrHashMismatch) || !errors.As(err, &be) || be.Block != 6 {
		t.Fatalf("WriteBlocks = %v, want ErrHashMismatch naming block 6", err)
	}
	if got := mustRead(t, r, 1, 6); !bytes.Equal(got, old) {
		t.Error("a rejected write changed data")
	}
	for i, v := range r.Versions() {
		if v.Dirty {
			t.Errorf("a rejected write dirtied extent %d", i)
		}
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	err := Spec{BlockSize: 1000, ExtentBlocks: 0, ExtentCount: MaxExtentCount + 1, FormatVersion: 7}.Validate()
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("Validate = %v, want ErrInvalidSpec", err)
	}
	for _, want := range []string{"uuid is nil", "block size 1000", "extent blocks is 0", "extent count 1048577", "format version 7"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate error %q does not mention %q", err, want)
		}
	}
	if n := len(err.(interface{ Unwrap() []error }).Unwrap()); n != 5 {
		t.Errorf("Validate reported %d problems, want 5", n)
	}
	err = Spec{UUID: uuid.New(), BlockSize: 4096, ExtentBlocks: MaxExtentBytes/4096 + 1, ExtentCount: 0, FormatVersion: FormatVersion1}.Validate()
	for _, want := range []string{"exceeds 536870912 bytes", "extent count is 0"} {
		if !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("Validate error %q does not mention %q", err, want)
		}
	}
}

func TestValidateAcceptsGoodSpecs(t *testing.T) {
	for _, s := range []Spec{
		testSpec(4096, DefaultExtentBytes/4096, 16),
		testSpec(512, DefaultExtentBytes/512, 1),
		testSpec(512, MaxExtentBytes/512, MaxExtentCount),
	} {
		if err := s.Validate(); err != nil {
			t.Errorf("Validate(%+v) = %v", s, err)
		}
	}
	s := testSpec(4096, 16384, 3)
	if s.Blocks() != 3*16384 || s.SizeBytes() != 3*64<<20 || s.ExtentBytes() != 64<<20 {
		t.Errorf("Blocks/SizeBytes/ExtentBytes = %d/%d/%d", s.Blocks(), s.SizeBytes(), s.ExtentBytes())
	}
}

func TestCreateRejectsInvalidSpecAndWritesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "r")
	if _, err := Create(dir, Spec{BlockSize: 4096}); !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("Create = %v, want ErrInvalidSpec", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Create of an invalid spec made %s", dir)
	}
}

func TestCreateOverExistingRegionFailsWithErrRegionExists(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 2))
	mustWrite(t, r, 0, pattern(5, 1, 512))
	if err := r.Flush(1, 1); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Create(r.Dir(), testSpec(512, 4, 2)); !errors.Is(err, ErrRegionExists) {
		t.Fatalf("Create over a region = %v, want ErrRegionExists", err)
	}
	r2 := reopen(t, r)
	if got := mustRead(t, r2, 0, 1); !bytes.Equal(got, pattern(5, 1, 512)) {
		t.Error("failed Create damaged the existing region")
	}
}

func TestCreateMakesMissingDirectoriesAndStoresSpec(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b", "region")
	spec := testSpec(4096, 16, 3)
	r := createRegionIn(t, dir, spec)
	if r.Spec() != spec {
		t.Errorf("Spec() = %+v, want %+v", r.Spec(), spec)
	}
	r = reopen(t, r)
	if r.Spec() != spec {
		t.Errorf("after reopen Spec() = %+v, want %+v", r.Spec(), spec)
	}
	js, err := os.ReadFile(filepath.Join(dir, "region.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{`"uuid"`, `"block_size": 4096`, `"extent_blocks": 16`, `"extent_count": 3`, `"format_version": 1`} {
		if !strings.Contains(string(js), key) {
			t.Errorf("region.json %s lacks %s", js, key)
		}
	}
}

func TestCreateOfLargeRegionWritesOnlyTrailers(t *testing.T) {
	// 4 GiB of 64 MiB extents.
	r := createRegion(t, testSpec(4096, DefaultExtentBytes/4096, 64))
	var used int64
	for id := range ids.ExtentID(64) {
		st, err := os.Stat(extentFile(r.Dir(), id))
		if err != nil {
			t.Fatal(err)
		}
		used += st.Sys().(*syscall.Stat_t).Blocks * 512
	}
	if used > 64*64<<10 {
		t.Errorf("creating a 4 GiB region used %d bytes of disk", used)
	}
}

func TestOpenOfMissingDirFailsWithErrNoRegion(t *testing.T) {
	if _, err := Open(filepath.Join(t.TempDir(), "nope")); !errors.Is(err, ErrNoRegion) {
		t.Errorf("Open(missing dir) = %v, want ErrNoRegion", err)
	}
	if _, err := Open(t.TempDir()); !errors.Is(err, ErrNoRegion) {
		t.Errorf("Open(empty dir) = %v, want ErrNoRegion", err)
	}
}

func TestOpenOfOpenRegionFailsWithErrInUse(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	if r2, err := Open(r.Dir()); !errors.Is(err, ErrInUse) {
		if err == nil {
			r2.Close()
		}
		t.Fatalf("second Open = %v, want ErrInUse", err)
	}
	reopen(t, r) // the lock is released by Close
}

func TestOpenRejectsDamagedRegionWithErrBadRegion(t *testing.T) {
	for _, tc := range []struct {
		name   string
		damage func(dir string) error
	}{
		{"truncated extent", func(dir string) error { return os.Truncate(extentFile(dir, 1), 4096) }},
		{"missing extent", func(dir string) error { return os.Remove(extentFile(dir, 1)) }},
		{"garbled region.json", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "region.json"), []byte("{not json"), 0o640)
		}},
		{"invalid region.json", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "region.json"), []byte(`{"block_size": 1}`), 0o640)
		}},
		{"garbled fence.json", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "fence.json"), []byte("]"), 0o640)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := createRegion(t, testSpec(512, 4, 2))
			r.Close()
			if err := tc.damage(r.Dir()); err != nil {
				t.Fatal(err)
			}
			if r2, err := Open(r.Dir()); !errors.Is(err, ErrBadRegion) {
				if err == nil {
					r2.Close()
				}
				t.Fatalf("Open = %v, want ErrBadRegion", err)
			}
			// The failed Open released the lock.
			if _, err := Open(r.Dir()); errors.Is(err, ErrInUse) {
				t.Fatal("failed Open left the region locked")
			}
		})
	}
}

func TestFlushedDataSurvivesCloseAndOpen(t *testing.T) {
	r := createRegion(t, testSpec(4096, 8, 4))
	p := pattern(6, 20, 4096)
	mustWrite(t, r, 6, p)
	if err := r.Flush(7, 3); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, r)
	if got := mustRead(t, r, 6, 20); !bytes.Equal(got, p) {
		t.Fatal("flushed data changed across Close/Open")
	}
	if bad := r.CorruptBlocks(); len(bad) != 0 {
		t.Errorf("CorruptBlocks = %v after a clean close", bad)
	}
}

func TestUnflushedButCompleteWritesSurviveCloseAndOpen(t *testing.T) {
	r := createRegion(t, testSpec(512, 8, 2))
	p := pattern(7, 10, 512)
	mustWrite(t, r, 3, p)
	r = reopen(t, r)
	if got := mustRead(t, r, 3, 10); !bytes.Equal(got, p) {
		t.Fatal("complete unflushed writes were lost without a crash")
	}
	if v := r.Versions(); !v[0].Dirty || !v[1].Dirty {
		t.Errorf("Versions = %+v, want both extents dirty until a flush", v)
	}
}

func TestFlushStampsOnlyExtentsWrittenSinceLastFlush(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 4))
	mustWrite(t, r, 0, pattern(8, 1, 512)) // extent 0
	mustWrite(t, r, 9, pattern(9, 1, 512)) // extent 2
	if v := r.Versions(); !v[0].Dirty || v[1].Dirty || !v[2].Dirty || v[3].Dirty {
		t.Fatalf("before flush Versions = %+v, want 0 and 2 dirty", v)
	}
	if err := r.Flush(10, 2); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, r, 4, pattern(10, 1, 512)) // extent 1
	if err := r.Flush(11, 2); err != nil {
		t.Fatal(err)
	}
	want := []Version{{Gen: 2, Flush: 10}, {Gen: 2, Flush: 11}, {Gen: 2, Flush: 10}, {}}
	check := func(when string, r *Region) {
		t.Helper()
		got := r.Versions()
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%s: extent %d version %+v, want %+v", when, i, got[i], want[i])
			}
			if v, err := r.ExtentVersion(ids.ExtentID(i)); err != nil || v != want[i] {
				t.Errorf("%s: ExtentVersion(%d) = %+v, %v", when, i, v, err)
			}
		}
	}
	check("open", r)
	r = reopen(t, r)
	check("reopened", r)
}

func TestWriteMakesTrailerDurablyDirtyBeforeData(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 2))
	mustWrite(t, r, 5, pattern(11, 1, 512))
	if tr, ok := rawTrailer(t, r.Dir(), r.Spec(), 1); !ok || !tr.ver.Dirty {
		t.Errorf("after a write, extent 1 trailer on disk = %+v (ok %v), want dirty", tr, ok)
	}
	if tr, ok := rawTrailer(t, r.Dir(), r.Spec(), 0); !ok || tr.ver.Dirty {
		t.Errorf("unwritten extent 0 trailer on disk = %+v (ok %v), want clean", tr, ok)
	}
	if err := r.Flush(1, 1); err != nil {
		t.Fatal(err)
	}
	if tr, ok := rawTrailer(t, r.Dir(), r.Spec(), 1); !ok || tr.ver != (Version{Gen: 1, Flush: 1}) {
		t.Errorf("after flush, extent 1 trailer on disk = %+v (ok %v)", tr, ok)
	}
}

func TestHighestGenSurvivesCloseAndOpen(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	if g := r.HighestGen(); g != 0 {
		t.Fatalf("new region HighestGen = %d", g)
	}
	for _, g := range []ids.Generation{1, 5, 5, 9} {
		if err := r.SetHighestGen(g); err != nil {
			t.Fatalf("SetHighestGen(%d): %v", g, err)
		}
	}
	r = reopen(t, r)
	if g := r.HighestGen(); g != 9 {
		t.Fatalf("HighestGen after reopen = %d, want 9", g)
	}
	if _, err := os.Stat(filepath.Join(r.Dir(), "fence.json.tmp")); !os.IsNotExist(err) {
		t.Error("SetHighestGen left its temporary file behind")
	}
}

func TestSetHighestGenRefusesLowerGeneration(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	if err := r.SetHighestGen(4); err != nil {
		t.Fatal(err)
	}
	if err := r.SetHighestGen(3); !errors.Is(err, ErrStaleGeneration) {
		t.Fatalf("SetHighestGen(3) after 4 = %v, want ErrStaleGeneration", err)
	}
	if g := r.HighestGen(); g != 4 {
		t.Errorf("HighestGen = %d, want 4", g)
	}
}

func TestOperationsAfterCloseFailWithErrClosed(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 512)
	h := hashesOf(p, 512)
	for name, err := range map[string]error{
		"ReadBlocks":       r.ReadBlocks(0, p, h),
		"WriteBlocks":      r.WriteBlocks(0, p, h),
		"Flush":            r.Flush(1, 1),
		"SetHighestGen":    r.SetHighestGen(1),
		"ReadExtentBlocks": r.ReadExtentBlocks(0, []uint32{0}, p, h),
		"RepairExtent":     r.RepairExtent(0, []uint32{0}, p, h, Version{}),
		"Close":            r.Close(),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
	if _, err := r.ExtentHashes(0, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("ExtentHashes after Close = %v, want ErrClosed", err)
	}
}

func TestConcurrentWritesReadsAndFlushesKeepEveryBlock(t *testing.T) {
	const (
		writers   = 4
		perWriter = 24
		bs        = 512
	)
	r := createRegion(t, testSpec(bs, 8, 12)) // 96 blocks, 24 per writer
	var wg sync.WaitGroup
	errs := make(chan error, writers+1)
	for w := range writers {
		wg.Go(func() {
			for round := range 5 {
				for i := range perWriter / 3 {
					b := ids.BlockIndex(w*perWriter + i*3)
					p := pattern(uint64(round*1000+int(b)), 3, bs)
					if err := r.WriteBlocks(b, p, hashesOf(p, bs)); err != nil {
						errs <- err
						return
					}
					if got, err := readChecked(r, b, 3); err != nil || !bytes.Equal(got, p) {
						errs <- fmt.Errorf("block %d read back wrong (err %v)", b, err)
						return
					}
				}
			}
		})
	}
	wg.Go(func() {
		for f := range uint64(20) {
			if err := r.Flush(f+1, 1); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if err := r.Flush(100, 1); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, r)
	for b := range ids.BlockIndex(writers * perWriter) {
		base := b / 3 * 3
		want := pattern(uint64(4000+int(base)), 3, bs)[(b-base)*bs : (b-base+1)*bs]
		if got := mustRead(t, r, b, 1); !bytes.Equal(got, want) {
			t.Fatalf("block %d lost its last write", b)
		}
	}
	// Extents the concurrent flusher already cleaned keep its number.
	for i, v := range r.Versions() {
		if v.Dirty || v.Gen != 1 || v.Flush == 0 {
			t.Errorf("extent %d version %+v after final flush", i, v)
		}
	}
}

func TestIOPathDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop buffers at random")
	}
	r := createRegion(t, testSpec(4096, 512, 2))
	p := pattern(12, 256, 4096) // 1 MiB
	h := hashesOf(p, 4096)
	mustWrite(t, r, 100, p)
	if n := testing.AllocsPerRun(50, func() { r.WriteBlocks(100, p, h) }); n != 0 {
		t.Errorf("WriteBlocks allocates %.1f times per call", n)
	}
	if n := testing.AllocsPerRun(50, func() { r.ReadBlocks(100, p, h) }); n != 0 {
		t.Errorf("ReadBlocks allocates %.1f times per call", n)
	}
}

func TestInterruptedSetHighestGenKeepsPreviousGeneration(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	if err := r.SetHighestGen(7); err != nil {
		t.Fatal(err)
	}
	r.Close()
	// The power went after the temporary file was half written, before
	// the rename.
	if err := os.WriteFile(filepath.Join(r.Dir(), "fence.json.tmp"), []byte(`{"highest_g`), 0o640); err != nil {
		t.Fatal(err)
	}
	r = reopen(t, r)
	if g := r.HighestGen(); g != 7 {
		t.Fatalf("HighestGen = %d, want the last completed 7", g)
	}
	if err := r.SetHighestGen(8); err != nil {
		t.Fatalf("SetHighestGen over a leftover temporary file: %v", err)
	}
	if g := reopen(t, r).HighestGen(); g != 8 {
		t.Fatalf("HighestGen = %d, want 8", g)
	}
}
