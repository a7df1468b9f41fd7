package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"tern/volume"
	"tern/volume/ids"
	"tern/volume/layout"
)

// VolumeScenarios are the IO shapes of `tern bench volume`, in the order
// they run (the sequential write fills the volume the reads then read).
var VolumeScenarios = []IOShape{
	{Name: "seqwrite_1m_qd32", Write: true, BlockBytes: 1 << 20, QueueDepth: 32},
	{Name: "randwrite_4k_qd32", Write: true, Random: true, BlockBytes: 4096, QueueDepth: 32},
	{Name: "randread_4k_qd32", Random: true, BlockBytes: 4096, QueueDepth: 32},
	{Name: "seqread_1m_qd32", BlockBytes: 1 << 20, QueueDepth: 32},
}

// VolumeOptions configure RunVolume.
type VolumeOptions struct {
	// Duration of each measurement (three per scenario: volume, local
	// file, bare QUIC).
	Duration time.Duration
	// VolumeBytes is the volume's size.
	VolumeBytes uint64
	// Dir holds the regions and certificates; empty means a temporary one.
	Dir string
	// Progress, when set, gets a line as each measurement starts.
	Progress io.Writer
}

// VolumeScenario is one row of the report (JSON keys are a contract).
type VolumeScenario struct {
	Name               string  `json:"name"`
	IOPS               float64 `json:"iops"`
	MiBPerSec          float64 `json:"mib_per_sec"`
	P50us              float64 `json:"p50_us"`
	P99us              float64 `json:"p99_us"`
	LimitLocalFileIOPS float64 `json:"limit_local_file_iops"`
	LimitQUICIOPS      float64 `json:"limit_quic_iops"`
	// RatioQUIC is IOPS / LimitQUICIOPS, the figure the targets use.
	RatioQUIC float64 `json:"ratio_quic"`
	// Target is the minimum RatioQUIC the project promises (0: none).
	Target float64 `json:"target_ratio_quic,omitempty"`
}

// VolumeReport is the JSON `tern bench volume --json` writes.
type VolumeReport struct {
	Scenarios   []VolumeScenario `json:"scenarios"`
	DurationSec float64          `json:"duration_seconds"`
	VolumeBytes uint64           `json:"volume_bytes"`
}

// volumeTargets are the promised ratios to one bare QUIC stream.
var volumeTargets = map[string]float64{
	"randwrite_4k_qd32": 0.15,
	"randread_4k_qd32":  0.5,
	"seqwrite_1m_qd32":  0.3,
}

// RunVolume starts three downstairs on loopback, activates an upstairs and
// measures every scenario against its two limits.
func RunVolume(ctx context.Context, opts VolumeOptions) (*VolumeReport, error) {
	if opts.Duration <= 0 {
		opts.Duration = 10 * time.Second
	}
	if opts.VolumeBytes == 0 {
		opts.VolumeBytes = 256 << 20
	}
	cl, cleanup, err := newCluster(opts.Dir, "tern-bench-volume", opts.VolumeBytes)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	say := sayer(opts.Progress)
	spec := cl.Spec
	if err := cl.StartAll(); err != nil {
		return nil, err
	}
	defer cl.Close()
	up, err := layout.Open(layout.Replicated, layout.Config{Targets: cl.Targets(), TLS: cl.ClientTLS})
	if err != nil {
		return nil, err
	}
	defer up.Close()
	if err := up.Activate(ctx, ids.Generation(1)); err != nil {
		return nil, fmt.Errorf("activating volume: %w", err)
	}
	space := int64(spec.SizeBytes())
	report := &VolumeReport{DurationSec: opts.Duration.Seconds(), VolumeBytes: spec.SizeBytes()}
	for _, shape := range VolumeScenarios {
		say("%s: volume", shape.Name)
		vol, err := volumeLoad(ctx, up, shape, space, opts.Duration)
		if err != nil {
			return nil, fmt.Errorf("%s on the volume: %w", shape.Name, err)
		}
		say("%s: local file limit", shape.Name)
		file, err := localFileLimit(ctx, cl.Dir, shape, space, opts.Duration)
		if err != nil {
			return nil, fmt.Errorf("%s on a local file: %w", shape.Name, err)
		}
		say("%s: bare QUIC limit", shape.Name)
		q, err := quicLimit(ctx, cl.ServerTLS, cl.ClientTLS, shape, opts.Duration)
		if err != nil {
			return nil, fmt.Errorf("%s over bare QUIC: %w", shape.Name, err)
		}
		report.Scenarios = append(report.Scenarios, VolumeScenario{
			Name:               shape.Name,
			IOPS:               vol.IOPS(),
			MiBPerSec:          vol.MiBPerSec(),
			P50us:              micros(vol.Percentile(0.50)),
			P99us:              micros(vol.Percentile(0.99)),
			LimitLocalFileIOPS: file.IOPS(),
			LimitQUICIOPS:      q.IOPS(),
			RatioQUIC:          vol.IOPS() / q.IOPS(),
			Target:             volumeTargets[shape.Name],
		})
	}
	return report, nil
}

func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// WriteTable prints the report for people.
func (r *VolumeReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%-18s %10s %9s %9s %9s %12s %12s %8s %7s\n",
		"scenario", "iops", "MiB/s", "p50 µs", "p99 µs", "file iops", "quic iops", "×quic", "target")
	for _, s := range r.Scenarios {
		target := "-"
		if s.Target > 0 {
			verdict := "met"
			if s.RatioQUIC < s.Target {
				verdict = "MISSED"
			}
			target = fmt.Sprintf("≥%.2f %s", s.Target, verdict)
		}
		fmt.Fprintf(w, "%-18s %10.0f %9.1f %9.0f %9.0f %12.0f %12.0f %8.2f %s\n",
			s.Name, s.IOPS, s.MiBPerSec, s.P50us, s.P99us, s.LimitLocalFileIOPS, s.LimitQUICIOPS, s.RatioQUIC, target)
	}
}

// WriteJSONFile writes v as indented JSON to path.
func WriteJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// volumeLoad drives shape against the volume up directly for d and,
// after writes, flushes, so the next scenario starts with nothing in
// flight.
func volumeLoad(ctx context.Context, up volume.Volume, shape IOShape, spaceBytes int64, d time.Duration) (Result, error) {
	res, err := runLoad(ctx, shape, spaceBytes, d, func(ctx context.Context, _ int, buf []byte, off int64) error {
		var err error
		if shape.Write {
			_, err = up.WriteAt(ctx, buf, off)
		} else {
			_, err = up.ReadAt(ctx, buf, off)
		}
		return err
	})
	if err != nil {
		return res, err
	}
	if shape.Write {
		if err := up.Flush(ctx); err != nil {
			return res, fmt.Errorf("flushing after %s: %w", shape.Name, err)
		}
	}
	return res, nil
}
