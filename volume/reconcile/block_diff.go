package reconcile

import (
	"errors"
	"fmt"
)

// ErrBlockCountMismatch means two hash lists for the same extent have
// different lengths, so they cannot describe the same extent geometry.
var ErrBlockCountMismatch = errors.New("block hash lists differ in length")

// DiffBlocks returns, in increasing order, the blocks of one extent whose
// hash on the source differs from the destination's: the only blocks the
// repair copies (Crucible copies the whole extent). source[i] and dest[i]
// are the per-block hashes the extent metadata records for block i.
//
// Equal hashes are taken to mean equal data, so the caller must pass
// hashes its extents have verified against their data: a torn block has
// to surface as a mismatch (or an error before this call), never as the
// stored hash of data that is no longer there.
func DiffBlocks(source, dest []uint64) ([]ExtentBlock, error) {
	if len(source) != len(dest) {
		return nil, fmt.Errorf("comparing block hashes: %w: source has %d, destination %d",
			ErrBlockCountMismatch, len(source), len(dest))
	}
	var differ []ExtentBlock
	for i := range source {
		if source[i] != dest[i] {
			differ = append(differ, ExtentBlock(i))
		}
	}
	return differ, nil
}

// BlockRun is a run of consecutive blocks within one extent.
type BlockRun struct {
	// Start is the first block of the run.
	Start ExtentBlock
	// Count is the number of blocks in the run; never zero.
	Count uint32
}

// Runs groups sorted, distinct block indexes (as DiffBlocks returns them)
// into maximal runs of consecutive blocks, so a repair can copy each run
// with one read and one write.
func Runs(blocks []ExtentBlock) []BlockRun {
	var runs []BlockRun
	for _, b := range blocks {
		if n := len(runs); n > 0 && runs[n-1].Start+ExtentBlock(runs[n-1].Count) == b {
			runs[n-1].Count++
			continue
		}
		runs = append(runs, BlockRun{Start: b, Count: 1})
	}
	return runs
}
