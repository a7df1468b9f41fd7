package bench

import (
	"context"
	"testing"
)

// TestRunRepairMovesFewerBytesThanWholeExtents runs the repair benchmark
// on a small volume and checks what it reports, not how fast it was.
func TestRunRepairMovesFewerBytesThanWholeExtents(t *testing.T) {
	if testing.Short() {
		t.Skip("fills three regions and activates twice")
	}
	rep, err := RunRepair(context.Background(), RepairOptions{VolumeBytes: 16 << 20, Diverge: 0.01, Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if rep.DivergedBlocks != 40 {
		t.Errorf("diverged %d blocks of 4096, want 1%% = 40", rep.DivergedBlocks)
	}
	if rep.BlockRepairBytes != uint64(rep.DivergedBlocks)*4096 {
		t.Errorf("block repair moved %d bytes, want exactly the %d diverged blocks", rep.BlockRepairBytes, rep.DivergedBlocks)
	}
	if rep.ExtentCopyBytes != rep.SizeBytes {
		t.Errorf("whole-extent copy moved %d bytes, want the whole %d-byte volume (every extent diverged)", rep.ExtentCopyBytes, rep.SizeBytes)
	}
	if rep.BlockRepairSeconds <= 0 || rep.ExtentCopySeconds <= 0 || rep.LimitQUICMiBPerSec <= 0 || rep.Speedup <= 0 {
		t.Errorf("report has empty measurements: %+v", rep)
	}
}
