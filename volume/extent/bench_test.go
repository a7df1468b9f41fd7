package extent

import (
	"os"
	"path/filepath"
	"tern/volume/ids"
	"testing"
)

// benchRegion is a 256 MiB region of 4 KiB blocks in 64 MiB extents, in
// the test's temporary directory (a real file system, page cache warm
// after the first pass).
func benchRegion(b *testing.B) *Region {
	return createRegion(b, testSpec(4096, DefaultExtentBytes/4096, 4))
}

func benchSizes() []struct {
	name   string
	blocks int
} {
	return []struct {
		name   string
		blocks int
	}{{"4KiB", 1}, {"1MiB", 256}}
}

// BenchmarkWriteBlocks writes sequentially through the first 64 MiB,
// wrapping around; every write is hash-verified and followed by its
// metadata write, as in the steady state between flushes.
func BenchmarkWriteBlocks(b *testing.B) {
	for _, size := range benchSizes() {
		b.Run(size.name, func(b *testing.B) {
			r := benchRegion(b)
			p := pattern(70, size.blocks, 4096)
			h := hashesOf(p, 4096)
			const span = 16384 // blocks in the first extent
			next := 0
			mustWrite(b, r, 0, p) // the extent's first write makes it dirty
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := r.WriteBlocks(ids.BlockIndex(next), p, h); err != nil {
					b.Fatal(err)
				}
				next = (next + size.blocks) % span
			}
		})
	}
}

// BenchmarkReadBlocks reads sequentially through 64 MiB of written data.
func BenchmarkReadBlocks(b *testing.B) {
	for _, size := range benchSizes() {
		b.Run(size.name, func(b *testing.B) {
			r := benchRegion(b)
			const span = 16384
			fill := pattern(71, 256, 4096)
			for blk := 0; blk < span; blk += 256 {
				mustWrite(b, r, ids.BlockIndex(blk), fill)
			}
			p := make([]byte, size.blocks*4096)
			h := make([]uint64, size.blocks)
			next := 0
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if err := r.ReadBlocks(ids.BlockIndex(next), p, h); err != nil {
					b.Fatal(err)
				}
				next = (next + size.blocks) % span
			}
		})
	}
}

// BenchmarkFlushOneDirtyExtent measures a 4 KiB write followed by a flush:
// the dirty-trailer fdatasync, then the flush's two fdatasyncs.
func BenchmarkFlushOneDirtyExtent(b *testing.B) {
	r := benchRegion(b)
	p := pattern(72, 1, 4096)
	h := hashesOf(p, 4096)
	b.ReportAllocs()
	n := uint64(0)
	for b.Loop() {
		n++
		if err := r.WriteBlocks(0, p, h); err != nil {
			b.Fatal(err)
		}
		if err := r.Flush(n, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawFileIO is the limit the region is measured against: plain
// pwrite and pread of the same sizes on a file in the same directory, with
// no hashing and no metadata.
func BenchmarkRawFileIO(b *testing.B) {
	for _, op := range []string{"pwrite", "pread"} {
		for _, size := range benchSizes() {
			b.Run(op+"/"+size.name, func(b *testing.B) {
				f, err := os.Create(filepath.Join(b.TempDir(), "raw"))
				if err != nil {
					b.Fatal(err)
				}
				defer f.Close()
				const span = 64 << 20
				if err := f.Truncate(span); err != nil {
					b.Fatal(err)
				}
				p := pattern(73, size.blocks, 4096)
				for off := int64(0); off < span; off += int64(len(p)) {
					if _, err := f.WriteAt(p, off); err != nil {
						b.Fatal(err)
					}
				}
				next := int64(0)
				b.SetBytes(int64(len(p)))
				b.ReportAllocs()
				b.ResetTimer()
				for b.Loop() {
					if op == "pwrite" {
						_, err = f.WriteAt(p, next)
					} else {
						_, err = f.ReadAt(p, next)
					}
					if err != nil {
						b.Fatal(err)
					}
					next = (next + int64(len(p))) % span
				}
			})
		}
	}
}
