package extent

import (
	"errors"
	"testing"
)

func TestSpecForSizeUsesDefaultExtentsAndRoundsUp(t *testing.T) {
	for _, tc := range []struct {
		size         uint64
		blockSize    uint32
		extentBlocks uint32
		extentCount  uint32
	}{
		{1 << 30, 4096, 16384, 16},
		{1<<30 + 1, 4096, 16384, 17},
		{1 << 30, 512, 131072, 16},
		{1 << 20, 4096, 256, 1},
		{1000, 512, 2, 1},
	} {
		s, err := SpecForSize(tc.size, tc.blockSize)
		if err != nil {
			t.Errorf("SpecForSize(%d, %d): %v", tc.size, tc.blockSize, err)
			continue
		}
		if s.ExtentBlocks != tc.extentBlocks || s.ExtentCount != tc.extentCount || s.SizeBytes() < tc.size {
			t.Errorf("SpecForSize(%d, %d) = %d blocks x %d extents", tc.size, tc.blockSize, s.ExtentBlocks, s.ExtentCount)
		}
	}
	for _, tc := range []struct {
		size      uint64
		blockSize uint32
	}{{0, 4096}, {1 << 20, 1024}, {1 << 62, 4096}} {
		if _, err := SpecForSize(tc.size, tc.blockSize); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("SpecForSize(%d, %d) = %v, want ErrInvalidSpec", tc.size, tc.blockSize, err)
		}
	}
}
