package extent

import (
	"bytes"
	"errors"
	"slices"
	"tern/volume/ids"
	"testing"
)

// diffBlocks returns the extent-relative blocks whose hashes differ.
func diffBlocks(a, b []uint64) []uint32 {
	var out []uint32
	for i := range a {
		if a[i] != b[i] {
			out = append(out, uint32(i))
		}
	}
	return out
}

// repairFrom copies the blocks of extent e that differ from src into dst,
// as the repair engineer's code does, and returns how many it copied.
func repairFrom(t *testing.T, src, dst *Region, e ids.ExtentID) int {
	t.Helper()
	srcHashes, err := src.ExtentHashes(e, nil)
	if err != nil {
		t.Fatal(err)
	}
	dstHashes, err := dst.ExtentHashes(e, nil)
	if err != nil {
		t.Fatal(err)
	}
	blocks := diffBlocks(srcHashes, dstHashes)
	bs := int(src.Spec().BlockSize)
	p := make([]byte, len(blocks)*bs)
	h := make([]uint64, len(blocks))
	if err := src.ReadExtentBlocks(e, blocks, p, h); err != nil {
		t.Fatal(err)
	}
	v, err := src.ExtentVersion(e)
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.RepairExtent(e, blocks, p, h, v); err != nil {
		t.Fatal(err)
	}
	return len(blocks)
}

// twoReplicas returns two regions with the same spec whose extent 1
// differs in blocks 1 and 3.
func twoReplicas(t *testing.T) (src, dst *Region) {
	spec := testSpec(512, 4, 2)
	src = createRegion(t, spec)
	dst = createRegion(t, spec)
	base := pattern(40, 8, 512)
	for _, r := range []*Region{src, dst} {
		mustWrite(t, r, 0, base)
		if err := r.Flush(1, 1); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(t, src, 5, pattern(41, 1, 512))
	mustWrite(t, src, 7, pattern(42, 1, 512))
	if err := src.Flush(2, 1); err != nil {
		t.Fatal(err)
	}
	return src, dst
}

func TestRepairCopiesOnlyDifferingBlocksAndMatchesSource(t *testing.T) {
	src, dst := twoReplicas(t)
	if v, w := src.Versions(), dst.Versions(); slices.Equal(v, w) {
		t.Fatal("replicas should differ before repair")
	}
	if n := repairFrom(t, src, dst, 0); n != 0 {
		t.Errorf("repair of an identical extent copied %d blocks", n)
	}
	if n := repairFrom(t, src, dst, 1); n != 2 {
		t.Errorf("repair copied %d blocks, want 2", n)
	}
	check := func(when string, dst *Region) {
		t.Helper()
		if v, w := src.Versions(), dst.Versions(); !slices.Equal(v, w) {
			t.Errorf("%s: versions %+v, source %+v", when, w, v)
		}
		a, _ := src.ExtentHashes(1, nil)
		b, _ := dst.ExtentHashes(1, nil)
		if !slices.Equal(a, b) {
			t.Errorf("%s: extent hashes differ from the source", when)
		}
		if !bytes.Equal(mustRead(t, src, 0, 8), mustRead(t, dst, 0, 8)) {
			t.Errorf("%s: data differs from the source", when)
		}
	}
	check("after repair", dst)
	check("after reopen", reopen(t, dst))
}

func TestInterruptedRepairLeavesExtentDirtyAndRetryCompletes(t *testing.T) {
	for _, step := range []crashStep{stepBeforeData, stepAfterData, stepAfterMeta, stepRepairWritten} {
		src, dst := twoReplicas(t)
		dst.faultHook = cutAt(step)
		srcHashes, _ := src.ExtentHashes(1, nil)
		dstHashes, _ := dst.ExtentHashes(1, nil)
		blocks := diffBlocks(srcHashes, dstHashes)
		p := make([]byte, len(blocks)*512)
		h := make([]uint64, len(blocks))
		if err := src.ReadExtentBlocks(1, blocks, p, h); err != nil {
			t.Fatal(err)
		}
		v, _ := src.ExtentVersion(1)
		if err := dst.RepairExtent(1, blocks, p, h, v); !errors.Is(err, errPowerCut) {
			t.Fatalf("step %d: RepairExtent = %v", step, err)
		}
		dst = reopen(t, dst)
		if got, _ := dst.ExtentVersion(1); !got.Dirty || got == v {
			t.Errorf("step %d: interrupted repair left version %+v (source %+v)", step, got, v)
		}
		repairFrom(t, src, dst, 1)
		if got, _ := dst.ExtentVersion(1); got != v {
			t.Errorf("step %d: retried repair left version %+v, want %+v", step, got, v)
		}
		if !bytes.Equal(mustRead(t, src, 4, 4), mustRead(t, dst, 4, 4)) {
			t.Errorf("step %d: retried repair left different data", step)
		}
	}
}

func TestRepairFixesCorruptBlocksFoundByHashComparison(t *testing.T) {
	src, dst := twoReplicas(t)
	// dst gets the same write as src to block 5, but the power goes after
	// the data, before the metadata: its recorded hash is the old one.
	mustWrite(t, dst, 7, pattern(42, 1, 512))
	dst.faultHook = cutAt(stepAfterData)
	p := pattern(41, 1, 512)
	if err := dst.WriteBlocks(5, p, hashesOf(p, 512)); !errors.Is(err, errPowerCut) {
		t.Fatal(err)
	}
	dst = reopen(t, dst)
	if got, _ := dst.ExtentCorruptBlocks(1); !slices.Equal(got, []uint32{1}) {
		t.Fatalf("ExtentCorruptBlocks = %v, want [1]", got)
	}
	// The corrupt block's data equals the source's, and its recorded hash
	// equals the source's old one: neither may make it compare equal.
	if n := repairFrom(t, src, dst, 1); n != 1 {
		t.Errorf("repair copied %d blocks, want only the corrupt one", n)
	}
	if got := dst.CorruptBlocks(); len(got) != 0 {
		t.Errorf("CorruptBlocks after repair = %v", got)
	}
	dst = reopen(t, dst)
	if !bytes.Equal(mustRead(t, src, 4, 4), mustRead(t, dst, 4, 4)) {
		t.Error("repaired data differs from the source")
	}
	if v, w := src.Versions(), dst.Versions(); !slices.Equal(v, w) {
		t.Errorf("versions %+v, source %+v", w, v)
	}
}

func TestRepairThatLeavesCorruptBlocksKeepsExtentDirty(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	r.faultHook = cutAt(stepAfterData)
	p := pattern(43, 2, 512)
	if err := r.WriteBlocks(0, p, hashesOf(p, 512)); !errors.Is(err, errPowerCut) {
		t.Fatal(err)
	}
	r = reopen(t, r)
	// Repair only block 0 of the two corrupt ones.
	if err := r.RepairExtent(0, []uint32{0}, p[:512], hashesOf(p[:512], 512), Version{Gen: 3, Flush: 3}); err != nil {
		t.Fatal(err)
	}
	if v, _ := r.ExtentVersion(0); v != (Version{Gen: 3, Flush: 3, Dirty: true}) {
		t.Errorf("version %+v, want the repair's numbers but dirty", v)
	}
	r = reopen(t, r)
	checkBlock(t, r, 0, nil, p[:512], readsNew)
	checkBlock(t, r, 1, nil, nil, readsCorrupt)
}

func TestReadExtentBlocksRefusesCorruptBlocks(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 2))
	r.faultHook = cutAt(stepAfterData)
	p := pattern(44, 1, 512)
	if err := r.WriteBlocks(6, p, hashesOf(p, 512)); !errors.Is(err, errPowerCut) {
		t.Fatal(err)
	}
	r = reopen(t, r)
	buf := make([]byte, 2*512)
	h := make([]uint64, 2)
	err := r.ReadExtentBlocks(1, []uint32{0, 2}, buf, h)
	var be *BlockError
	if !errors.Is(err, ErrCorruptBlock) || !errors.As(err, &be) || be.Block != 6 {
		t.Errorf("ReadExtentBlocks = %v, want ErrCorruptBlock naming block 6", err)
	}
	if err := r.ReadExtentBlocks(1, []uint32{3, 0}, buf, h); err != nil {
		t.Errorf("ReadExtentBlocks of healthy blocks = %v", err)
	}
}

func TestRepairWithWrongHashWritesNothing(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	p := pattern(45, 2, 512)
	h := hashesOf(p, 512)
	h[1]++
	if err := r.RepairExtent(0, []uint32{2, 3}, p, h, Version{Gen: 1, Flush: 1}); !errors.Is(err, ErrHashMismatch) {
		t.Fatalf("RepairExtent = %v, want ErrHashMismatch", err)
	}
	if v, _ := r.ExtentVersion(0); v != (Version{}) {
		t.Errorf("a rejected repair changed the version to %+v", v)
	}
	checkBlock(t, r, 2, make([]byte, 512), nil, readsOld)
}

func TestRepairPrimitivesRejectBadArguments(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 2))
	p := make([]byte, 512)
	h := hashesOf(p, 512)
	for name, err := range map[string]error{
		"read: no such extent":    r.ReadExtentBlocks(2, []uint32{0}, p, h),
		"read: block past extent": r.ReadExtentBlocks(0, []uint32{4}, p, h),
		"repair: no such extent":  r.RepairExtent(9, []uint32{0}, p, h, Version{}),
		"repair: block past":      r.RepairExtent(1, []uint32{7}, p, h, Version{}),
	} {
		if !errors.Is(err, ErrOutOfRange) {
			t.Errorf("%s = %v, want ErrOutOfRange", name, err)
		}
	}
	for name, err := range map[string]error{
		"read: short buffer":      r.ReadExtentBlocks(0, []uint32{0, 1}, p, h),
		"repair: missing hashes":  r.RepairExtent(0, []uint32{0}, p, nil, Version{}),
		"repair: too many blocks": r.RepairExtent(0, []uint32{0, 1}, p, h, Version{}),
	} {
		if !errors.Is(err, ErrUnaligned) {
			t.Errorf("%s = %v, want ErrUnaligned", name, err)
		}
	}
	if _, err := r.ExtentHashes(2, nil); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("ExtentHashes(2) = %v, want ErrOutOfRange", err)
	}
	if _, err := r.ExtentCorruptBlocks(2); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("ExtentCorruptBlocks(2) = %v, want ErrOutOfRange", err)
	}
}

func TestExtentHashesReusesDestination(t *testing.T) {
	r := createRegion(t, testSpec(512, 4, 1))
	dst := make([]uint64, 10)
	got, err := r.ExtentHashes(0, dst)
	if err != nil || len(got) != 4 || &got[0] != &dst[0] {
		t.Errorf("ExtentHashes = len %d, %v; want 4 hashes in dst's storage", len(got), err)
	}
}
