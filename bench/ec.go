package bench

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"tern/volume"
	"tern/volume/downstairs"
	"tern/volume/ec"
	"tern/volume/extent"
	"tern/volume/layout"
	"tern/volume/volumetest"
)

// ECOptions configure RunEC.
type ECOptions struct {
	// Layout is the erasure-coded volume's layout (default 4+2).
	Layout ec.Layout
	// Duration of each measurement.
	Duration time.Duration
	// VolumeBytes is the client-visible size of both volumes.
	VolumeBytes uint64
	// Dir holds the regions and certificates; empty means a temporary one.
	Dir string
	// Progress, when set, gets a line as each step starts.
	Progress io.Writer
}

// ECScenario is one IO shape on both volumes (JSON keys are a contract).
type ECScenario struct {
	Name                string  `json:"name"`
	ReplicatedMiBPerSec float64 `json:"replicated_mib_per_sec"`
	ReplicatedIOPS      float64 `json:"replicated_iops"`
	ECMiBPerSec         float64 `json:"ec_mib_per_sec"`
	ECIOPS              float64 `json:"ec_iops"`
	// Ratio is ECMiBPerSec / ReplicatedMiBPerSec.
	Ratio float64 `json:"ratio"`
}

// ECReport is what `tern bench ec --json` writes.
type ECReport struct {
	Layout      string       `json:"layout"`
	VolumeBytes uint64       `json:"volume_bytes"`
	DurationSec float64      `json:"duration_seconds"`
	Scenarios   []ECScenario `json:"scenarios"`
	// StoredPerWritten is the bytes the downstairs allocated (data and
	// metadata, every replica or shard) per byte the client wrote, after
	// one sequential fill of the whole volume.
	ReplicatedStoredPerWritten float64 `json:"replicated_stored_per_written"`
	ECStoredPerWritten         float64 `json:"ec_stored_per_written"`
	// EncodeMiBPerSec is one core's Reed-Solomon encode rate over
	// 1 MiB of data; EncodeCPUShare is the EC sequential write's rate
	// over it: the share of one core encoding takes at that rate.
	EncodeMiBPerSec float64 `json:"encode_mib_per_sec"`
	EncodeCPUShare  float64 `json:"encode_cpu_share"`
	// Rebuild seconds: one downstairs replaced by an empty region,
	// rebuilt by the next activation (replica copy vs reconstruction).
	ReplicaRebuildSeconds float64 `json:"replica_rebuild_seconds"`
	ShardRebuildSeconds   float64 `json:"shard_rebuild_seconds"`
}

// RunEC measures a three-replica volume and an erasure-coded one of the
// same client size on loopback in one run: the IO scenarios of `tern bench
// volume`, the bytes stored per byte written, the encode cost, and the
// rebuild of one lost downstairs.
func RunEC(ctx context.Context, opts ECOptions) (*ECReport, error) {
	if opts.Layout == (ec.Layout{}) {
		opts.Layout = ec.DefaultLayout
	}
	if opts.Duration <= 0 {
		opts.Duration = 10 * time.Second
	}
	if opts.VolumeBytes == 0 {
		opts.VolumeBytes = 256 << 20
	}
	l := opts.Layout
	dir, removeDir, err := workDir(opts.Dir, "tern-bench-ec")
	if err != nil {
		return nil, err
	}
	defer removeDir()
	say := sayer(opts.Progress)
	repSpec, err := extent.SpecForSize(opts.VolumeBytes, 4096)
	if err != nil {
		return nil, err
	}
	// A shard holds 1/k of the volume plus its metadata block.
	shardSpec, err := extent.SpecForSize(opts.VolumeBytes/uint64(l.Data)+4096, 4096)
	if err != nil {
		return nil, err
	}
	rep, err := volumetest.NewClusterN(filepath.Join(dir, "replicated"), repSpec, 3)
	if err != nil {
		return nil, err
	}
	defer rep.Close()
	shards, err := volumetest.NewClusterN(filepath.Join(dir, "ec"), shardSpec, l.Shards())
	if err != nil {
		return nil, err
	}
	defer shards.Close()
	if err := rep.StartAll(); err != nil {
		return nil, err
	}
	if err := shards.StartAll(); err != nil {
		return nil, err
	}
	repTargets, ecTargets := rep.Targets(), shards.Targets()
	up, err := layout.Open(layout.Replicated, layout.Config{Targets: repTargets, TLS: rep.ClientTLS})
	if err != nil {
		return nil, err
	}
	defer up.Close()
	if err := up.Activate(ctx, 1); err != nil {
		return nil, fmt.Errorf("activating the replicated volume: %w", err)
	}
	v, err := layout.Open(layout.ErasureCoded(l), layout.Config{Targets: ecTargets, TLS: shards.ClientTLS})
	if err != nil {
		return nil, err
	}
	defer v.Close()
	if err := v.Activate(ctx, 1); err != nil {
		return nil, fmt.Errorf("activating the %v volume: %w", l, err)
	}
	space := int64(opts.VolumeBytes)
	report := &ECReport{Layout: l.String(), VolumeBytes: opts.VolumeBytes, DurationSec: opts.Duration.Seconds()}

	say("filling both volumes once (%d MiB)", space>>20)
	for _, vol := range []volume.Volume{up, v} {
		if err := fillOnce(ctx, vol, space); err != nil {
			return nil, err
		}
	}
	repStored, err := allocatedBytes(filepath.Join(dir, "replicated"))
	if err != nil {
		return nil, err
	}
	ecStored, err := allocatedBytes(filepath.Join(dir, "ec"))
	if err != nil {
		return nil, err
	}
	report.ReplicatedStoredPerWritten = float64(repStored) / float64(space)
	report.ECStoredPerWritten = float64(ecStored) / float64(space)

	for _, shape := range VolumeScenarios {
		say("%s: replicated", shape.Name)
		r, err := volumeLoad(ctx, up, shape, space, opts.Duration)
		if err != nil {
			return nil, fmt.Errorf("%s on the replicated volume: %w", shape.Name, err)
		}
		say("%s: %v", shape.Name, l)
		e, err := volumeLoad(ctx, v, shape, space, opts.Duration)
		if err != nil {
			return nil, fmt.Errorf("%s on the %v volume: %w", shape.Name, l, err)
		}
		report.Scenarios = append(report.Scenarios, ECScenario{
			Name: shape.Name, ReplicatedMiBPerSec: r.MiBPerSec(), ReplicatedIOPS: r.IOPS(),
			ECMiBPerSec: e.MiBPerSec(), ECIOPS: e.IOPS(), Ratio: e.MiBPerSec() / r.MiBPerSec(),
		})
	}
	say("encode rate")
	if report.EncodeMiBPerSec, err = encodeRate(l, time.Second); err != nil {
		return nil, err
	}
	for _, s := range report.Scenarios {
		if s.Name == "seqwrite_1m_qd32" {
			report.EncodeCPUShare = s.ECMiBPerSec / report.EncodeMiBPerSec
		}
	}
	if err := up.Close(); err != nil {
		return nil, err
	}
	if err := v.Close(); err != nil {
		return nil, err
	}

	say("rebuilding a replaced replica")
	if report.ReplicaRebuildSeconds, err = rebuildOne(ctx, rep, repSpec, func() (volume.Volume, error) {
		return layout.Open(layout.Replicated, layout.Config{Targets: repTargets, TLS: rep.ClientTLS})
	}); err != nil {
		return nil, fmt.Errorf("replica rebuild: %w", err)
	}
	say("rebuilding a replaced shard")
	if report.ShardRebuildSeconds, err = rebuildOne(ctx, shards, shardSpec, func() (volume.Volume, error) {
		return layout.Open(layout.ErasureCoded(l), layout.Config{Targets: ecTargets, TLS: shards.ClientTLS})
	}); err != nil {
		return nil, fmt.Errorf("shard rebuild: %w", err)
	}
	return report, nil
}

// fillOnce writes every byte of [0, space) once, 1 MiB at a time with 8
// in flight, and flushes.
func fillOnce(ctx context.Context, vol volume.Volume, space int64) error {
	const chunk = 1 << 20
	errs := make(chan error, 8)
	next := make(chan int64)
	for range 8 {
		go func() {
			buf := make([]byte, chunk)
			for off := range next {
				for i := range buf {
					buf[i] = byte(off>>20) + byte(i)
				}
				if _, err := vol.WriteAt(ctx, buf[:min(chunk, space-off)], off); err != nil {
					errs <- err
					for range next {
					}
					return
				}
			}
			errs <- nil
		}()
	}
	for off := int64(0); off < space; off += chunk {
		next <- off
	}
	close(next)
	for range 8 {
		if err := <-errs; err != nil {
			return fmt.Errorf("filling: %w", err)
		}
	}
	return vol.Flush(ctx)
}

// allocatedBytes sums the disk space the files under dir occupy.
func allocatedBytes(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && filepath.Ext(path) == ".ext" {
			total += st.Blocks * 512
		}
		return nil
	})
	return total, err
}

// encodeRate is how many MiB of data one core encodes per second, 1 MiB
// (256 stripes of 4 KiB blocks) at a time.
func encodeRate(l ec.Layout, d time.Duration) (float64, error) {
	c, err := ec.NewCodec(l)
	if err != nil {
		return 0, err
	}
	const bs = 4096
	stripes := (1 << 20) / (bs * l.Data)
	blocks := make([][]byte, l.Shards())
	for i := range blocks {
		blocks[i] = make([]byte, stripes*bs)
	}
	start := time.Now()
	n := 0
	for time.Since(start) < d {
		stripe := make([][]byte, l.Shards())
		for s := range stripes {
			for i := range stripe {
				stripe[i] = blocks[i][s*bs : (s+1)*bs]
			}
			if err := c.Encode(stripe); err != nil {
				return 0, err
			}
		}
		n++
	}
	return float64(n) / time.Since(start).Seconds(), nil
}

// rebuildOne replaces downstairs 0 of cl with an empty region and times
// the activation that rebuilds it.
func rebuildOne(ctx context.Context, cl *volumetest.Cluster, spec extent.Spec, open func() (volume.Volume, error)) (float64, error) {
	if err := cl.Stop(0); err != nil {
		return 0, err
	}
	if err := os.RemoveAll(cl.RegionDir(0)); err != nil {
		return 0, err
	}
	if err := downstairs.Create(cl.RegionDir(0), spec); err != nil {
		return 0, err
	}
	if err := cl.Start(0); err != nil {
		return 0, err
	}
	vol, err := open()
	if err != nil {
		return 0, err
	}
	defer vol.Close()
	start := time.Now()
	if err := vol.Activate(ctx, 2); err != nil {
		return 0, err
	}
	return time.Since(start).Seconds(), nil
}

// WriteTable prints the report for people.
func (r *ECReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%-18s %16s %16s %8s\n", "scenario", "3-replica MiB/s", r.Layout+" MiB/s", "ratio")
	for _, s := range r.Scenarios {
		fmt.Fprintf(w, "%-18s %16.1f %16.1f %8.2f\n", s.Name, s.ReplicatedMiBPerSec, s.ECMiBPerSec, s.Ratio)
	}
	fmt.Fprintf(w, "bytes stored per byte written: 3-replica %.2f, %s %.2f\n", r.ReplicatedStoredPerWritten, r.Layout, r.ECStoredPerWritten)
	fmt.Fprintf(w, "encode: %.0f MiB/s on one core; the EC sequential write takes %.1f%% of a core for it\n", r.EncodeMiBPerSec, 100*r.EncodeCPUShare)
	fmt.Fprintf(w, "rebuild of one replaced downstairs (%d MiB volume): replica %.2fs, shard %.2fs\n", r.VolumeBytes>>20, r.ReplicaRebuildSeconds, r.ShardRebuildSeconds)
}
