package extent

import (
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"tern/volume/ids"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// errPowerCut is what a faultHook returns to stop an operation where a
// power cut would.
var errPowerCut = errors.New("simulated power cut")

// testSpec returns a valid spec.
func testSpec(blockSize, extentBlocks, extentCount uint32) Spec {
	return NewSpec(blockSize, extentBlocks, extentCount)
}

// createRegion creates a region in a fresh temporary directory and closes
// it at the end of the test (ignoring ErrClosed).
func createRegion(t testing.TB, spec Spec) *Region {
	t.Helper()
	return createRegionIn(t, filepath.Join(t.TempDir(), "region"), spec)
}

func createRegionIn(t testing.TB, dir string, spec Spec) *Region {
	t.Helper()
	r, err := Create(dir, spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// reopen closes r (as a power cut would: without flushing) and opens its
// directory again.
func reopen(t testing.TB, r *Region) *Region {
	t.Helper()
	if err := r.Close(); err != nil && !errors.Is(err, ErrClosed) {
		t.Fatalf("Close: %v", err)
	}
	r2, err := Open(r.Dir())
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { r2.Close() })
	return r2
}

// pattern returns n blocks of pseudo-random data determined by seed.
func pattern(seed uint64, n int, blockSize uint32) []byte {
	p := make([]byte, n*int(blockSize))
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := 0; i+8 <= len(p); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			p[i+j] = byte(v >> (8 * j))
		}
	}
	return p
}

// hashesOf returns the xxhash64 of every block of p.
func hashesOf(p []byte, blockSize uint32) []uint64 {
	out := make([]uint64, len(p)/int(blockSize))
	for i := range out {
		out[i] = xxhash.Sum64(p[i*int(blockSize) : (i+1)*int(blockSize)])
	}
	return out
}

// mustWrite writes p at first with correct hashes.
func mustWrite(t testing.TB, r *Region, first ids.BlockIndex, p []byte) {
	t.Helper()
	if err := r.WriteBlocks(first, p, hashesOf(p, r.Spec().BlockSize)); err != nil {
		t.Fatalf("WriteBlocks(%d): %v", first, err)
	}
}

// mustRead reads n blocks at first and checks that every returned hash
// matches the returned data.
func mustRead(t testing.TB, r *Region, first ids.BlockIndex, n int) []byte {
	t.Helper()
	p, err := readChecked(r, first, n)
	if err != nil {
		t.Fatalf("ReadBlocks(%d, %d): %v", first, n, err)
	}
	return p
}

// readChecked reads n blocks at first; it fails if a returned hash does
// not match the returned data (wrong data served silently).
func readChecked(r *Region, first ids.BlockIndex, n int) ([]byte, error) {
	bs := r.Spec().BlockSize
	p := make([]byte, n*int(bs))
	hashes := make([]uint64, n)
	if err := r.ReadBlocks(first, p, hashes); err != nil {
		return nil, err
	}
	for i, h := range hashesOf(p, bs) {
		if h != hashes[i] {
			return nil, errors.New("read returned data that does not match its recorded hash")
		}
	}
	return p, nil
}

// extentFile returns the path of extent id's file in dir.
func extentFile(dir string, id ids.ExtentID) string { return filepath.Join(dir, extentFileName(id)) }

// rawWriteAt writes b into extent id's file at off, bypassing the Region
// (the region must be closed): it builds the state a power cut leaves.
func rawWriteAt(t testing.TB, dir string, id ids.ExtentID, b []byte, off int64) {
	t.Helper()
	f, err := os.OpenFile(extentFile(dir, id), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

// rawReadAt reads n bytes of extent id's file at off.
func rawReadAt(t testing.TB, dir string, id ids.ExtentID, n int, off int64) []byte {
	t.Helper()
	f, err := os.Open(extentFile(dir, id))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

// rawTrailer decodes extent id's trailer straight from its file.
func rawTrailer(t testing.TB, dir string, spec Spec, id ids.ExtentID) (trailer, bool) {
	t.Helper()
	return decodeTrailer(rawReadAt(t, dir, id, trailerSize, newLayout(spec).trailerOff), id)
}
