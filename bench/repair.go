package bench

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"tern/volume/extent"
	"tern/volume/ids"
	"tern/volume/upstairs"
)

// RepairOptions configure RunRepair.
type RepairOptions struct {
	// VolumeBytes is the volume's size (64 MiB extents).
	VolumeBytes uint64
	// Diverge is the fraction of blocks (0 < Diverge ≤ 1) on which one
	// replica falls behind, scattered over the whole volume.
	Diverge float64
	// Dir holds the regions; empty means a temporary directory.
	Dir string
	// Progress, when set, gets a line as each step starts.
	Progress io.Writer
}

// RepairReport is the JSON `tern bench repair --json` writes; the first
// seven keys are a contract.
type RepairReport struct {
	SizeBytes          uint64  `json:"size_bytes"`
	DivergedBlocks     int     `json:"diverged_blocks"`
	BlockRepairSeconds float64 `json:"block_repair_seconds"`
	BlockRepairBytes   uint64  `json:"block_repair_bytes"`
	ExtentCopySeconds  float64 `json:"extent_copy_seconds"`
	ExtentCopyBytes    uint64  `json:"extent_copy_bytes"`
	Speedup            float64 `json:"speedup"`
	ExtentsRepaired    uint64  `json:"extents_repaired"`
	// ExtentCopyMiBPerSec is whole-extent copying's payload rate, and
	// LimitQUICMiBPerSec one bare QUIC stream's with 1 MiB writes at
	// queue depth 8, measured in the same run.
	ExtentCopyMiBPerSec float64 `json:"extent_copy_mib_per_sec"`
	LimitQUICMiBPerSec  float64 `json:"limit_quic_mib_per_sec"`
	RatioQUIC           float64 `json:"extent_copy_ratio_quic"`
}

// RunRepair builds a volume whose replica 2 is behind on a scattered
// fraction of blocks and measures activation (which repairs it) twice in
// one run: block-level repair, then — after making the same blocks stale
// again — tern's whole-extent mode (upstairs.Config.RepairWholeExtents)
// on the same extents. That mode is Crucible's approach (copy every block
// of a diverged extent) run inside tern: the copy is relayed through the
// upstairs like every repair here, not sent downstairs to downstairs as
// Crucible's repair server does.
func RunRepair(ctx context.Context, opts RepairOptions) (*RepairReport, error) {
	if opts.VolumeBytes == 0 {
		opts.VolumeBytes = 1 << 30
	}
	if opts.Diverge <= 0 || opts.Diverge > 1 {
		return nil, fmt.Errorf("diverge %v: want a fraction in (0, 1]", opts.Diverge)
	}
	cl, cleanup, err := newCluster(opts.Dir, "tern-bench-repair", opts.VolumeBytes)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	say := sayer(opts.Progress)
	spec := cl.Spec
	say("filling three %d MiB replicas", spec.SizeBytes()>>20)
	for i := range 3 {
		if err := fillRegion(cl.RegionDir(i), spec); err != nil {
			return nil, err
		}
	}
	blocks := scatteredBlocks(spec, opts.Diverge)
	rep := &RepairReport{SizeBytes: spec.SizeBytes(), DivergedBlocks: len(blocks)}
	gen := ids.Generation(1)
	measure := func(round uint64, whole bool) (time.Duration, upstairs.RepairStats, error) {
		for _, i := range []int{0, 1} {
			if err := divergeRegion(cl.RegionDir(i), spec, blocks, round); err != nil {
				return 0, upstairs.RepairStats{}, err
			}
		}
		if err := cl.StartAll(); err != nil {
			return 0, upstairs.RepairStats{}, err
		}
		defer cl.Close()
		up, err := upstairs.New(upstairs.Config{Targets: cl.Targets(), TLS: cl.ClientTLS, RepairWholeExtents: whole})
		if err != nil {
			return 0, upstairs.RepairStats{}, err
		}
		defer up.Close()
		gen++
		start := time.Now()
		if err := up.Activate(ctx, gen); err != nil {
			return 0, upstairs.RepairStats{}, fmt.Errorf("activating: %w", err)
		}
		took := time.Since(start)
		return took, up.RepairStats(), up.Close()
	}
	say("block-level repair of %d diverged blocks", len(blocks))
	took, stats, err := measure(1, false)
	if err != nil {
		return nil, fmt.Errorf("block-level repair: %w", err)
	}
	rep.BlockRepairSeconds, rep.BlockRepairBytes, rep.ExtentsRepaired = took.Seconds(), stats.BytesCopied, stats.ExtentsRepaired
	say("whole-extent copy of the same extents")
	took, stats, err = measure(2, true)
	if err != nil {
		return nil, fmt.Errorf("whole-extent repair: %w", err)
	}
	rep.ExtentCopySeconds, rep.ExtentCopyBytes = took.Seconds(), stats.BytesCopied
	rep.Speedup = rep.ExtentCopySeconds / rep.BlockRepairSeconds
	rep.ExtentCopyMiBPerSec = float64(rep.ExtentCopyBytes) / (1 << 20) / rep.ExtentCopySeconds

	say("bare QUIC limit")
	shape := IOShape{Name: "quic_1m_qd8", Write: true, BlockBytes: 1 << 20, QueueDepth: 8}
	q, err := quicLimit(ctx, cl.ServerTLS, cl.ClientTLS, shape, 3*time.Second)
	if err != nil {
		return nil, err
	}
	rep.LimitQUICMiBPerSec = q.MiBPerSec()
	rep.RatioQUIC = rep.ExtentCopyMiBPerSec / rep.LimitQUICMiBPerSec
	return rep, nil
}

// fillRegion writes the same pseudo-random pattern (seed 1) over a whole
// region and flushes it at generation 1, straight through the extent
// layer: three identical replicas, as after a healthy life.
func fillRegion(dir string, spec extent.Spec) error {
	r, err := extent.Open(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	bs := int(spec.BlockSize)
	buf := make([]byte, 1<<20)
	hashes := make([]uint64, len(buf)/bs)
	for first := uint64(0); first < spec.Blocks(); first += uint64(len(hashes)) {
		n := min(uint64(len(hashes)), spec.Blocks()-first)
		upstairs.FillPattern(buf[:int(n)*bs], bs, first, 1)
		for i := range n {
			hashes[i] = xxhash.Sum64(buf[int(i)*bs : int(i+1)*bs])
		}
		if err := r.WriteBlocks(ids.BlockIndex(first), buf[:int(n)*bs], hashes[:n]); err != nil {
			return fmt.Errorf("filling %s: %w", dir, err)
		}
	}
	if err := r.Flush(1, 1); err != nil {
		return err
	}
	return r.Close()
}

// scatteredBlocks picks fraction×blocks distinct blocks uniformly (fixed
// seed, so runs compare).
func scatteredBlocks(spec extent.Spec, fraction float64) []uint64 {
	total := spec.Blocks()
	n := max(1, int(float64(total)*fraction))
	rng := rand.New(rand.NewPCG(0x7e7a, 0x1))
	seen := make(map[uint64]bool, n)
	out := make([]uint64, 0, n)
	for len(out) < n {
		b := rng.Uint64N(total)
		if !seen[b] {
			seen[b] = true
			out = append(out, b)
		}
	}
	slices.Sort(out)
	return out
}

// divergeRegion rewrites blocks with round-specific data and flushes with
// a higher flush number: the replicas that took these writes move ahead
// of the stale one.
func divergeRegion(dir string, spec extent.Spec, blocks []uint64, round uint64) error {
	r, err := extent.Open(dir)
	if err != nil {
		return err
	}
	defer r.Close()
	bs := int(spec.BlockSize)
	buf := make([]byte, bs)
	for _, b := range blocks {
		upstairs.FillPattern(buf, bs, b, 100+round)
		if err := r.WriteBlocks(ids.BlockIndex(b), buf, []uint64{xxhash.Sum64(buf)}); err != nil {
			return fmt.Errorf("diverging %s: %w", dir, err)
		}
	}
	if err := r.Flush(10+round, 1); err != nil {
		return err
	}
	return r.Close()
}

// WriteTable prints the report for people.
func (r *RepairReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "volume %d MiB, %d blocks diverged on one replica (%d extents)\n", r.SizeBytes>>20, r.DivergedBlocks, r.ExtentsRepaired)
	fmt.Fprintf(w, "%-62s %10s %12s\n", "method", "seconds", "MiB moved")
	fmt.Fprintf(w, "%-62s %10.3f %12.1f\n", "block-level (tern)", r.BlockRepairSeconds, float64(r.BlockRepairBytes)/(1<<20))
	fmt.Fprintf(w, "%-62s %10.3f %12.1f\n", "whole-extent copy (tern's whole-extent mode, via the upstairs)", r.ExtentCopySeconds, float64(r.ExtentCopyBytes)/(1<<20))
	fmt.Fprintf(w, "speedup %.1f× (target ≥ 10)\n", r.Speedup)
	fmt.Fprintf(w, "whole-extent copy %.1f MiB/s vs bare QUIC %.1f MiB/s: %.2f× (target ≥ 0.5)\n",
		r.ExtentCopyMiBPerSec, r.LimitQUICMiBPerSec, r.RatioQUIC)
}
