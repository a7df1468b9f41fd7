package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"tern/bench"
	"tern/internal/units"
)

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure tern beside the limits of this machine (volume IO, repair)",
	}
	cmd.AddCommand(newBenchVolumeCmd(), newBenchECCmd(), newBenchRepairCmd(), newBenchSimCmd(), newBenchSoakCmd(), newBenchCrashCmd(),
		newBenchBootCmd(), newBenchStartCmd(), newBenchMigrateCmd(), newBenchNBDCmd(), newBenchDataplaneCmd())
	return cmd
}

func newBenchVolumeCmd() *cobra.Command {
	var (
		jsonPath string
		duration time.Duration
		size     = units.Bytes(256 << 20)
	)
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Volume IO on three loopback downstairs vs a local file and a bare QUIC stream",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			report, err := bench.RunVolume(cmd.Context(), bench.VolumeOptions{
				Duration:    duration,
				VolumeBytes: uint64(size),
				Progress:    os.Stderr,
			})
			if err != nil {
				return err
			}
			report.WriteTable(cmd.OutOrStdout())
			if jsonPath != "" {
				return bench.WriteJSONFile(jsonPath, report)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&jsonPath, "json", "", "also write the report as JSON to this file")
	cmd.Flags().DurationVar(&duration, "duration", 10*time.Second, "length of each measurement")
	cmd.Flags().Var(&size, "size", "volume size")
	return cmd
}

func newBenchNBDCmd() *cobra.Command {
	var (
		jsonPath string
		duration time.Duration
		size     = units.Bytes(256 << 20)
	)
	cmd := &cobra.Command{
		Use:   "nbd",
		Short: "fio over NBD on a three-replica volume vs the same load on its upstairs directly, nbdkit memory and qemu-nbd",
		Long: "Serve a volume on three loopback downstairs over NBD and run fio's nbd engine against it (1 MiB " +
			"sequential write, 4 KiB random write and read, queue depth 32), the same shapes on the upstairs " +
			"directly (in-process, as `tern bench volume` drives it), and fio against `nbdkit memory` and " +
			"`qemu-nbd` on a local raw file. Needs fio, nbdkit and qemu-nbd. The JSON is an array, one object " +
			"per scenario, with scenario, nbd_iops, direct_iops and nbd_to_direct.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rows, err := bench.RunNBD(cmd.Context(), bench.NBDOptions{
				Duration:    duration,
				VolumeBytes: uint64(size),
				Progress:    os.Stderr,
			})
			if err != nil {
				return err
			}
			bench.WriteNBDTable(cmd.OutOrStdout(), rows)
			if jsonPath != "" {
				return bench.WriteJSONFile(jsonPath, rows)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&jsonPath, "json", "", "also write the report as JSON to this file")
	cmd.Flags().DurationVar(&duration, "duration", 10*time.Second, "length of each measurement")
	cmd.Flags().Var(&size, "size", "volume size")
	return cmd
}

func newBenchRepairCmd() *cobra.Command {
	var (
		jsonPath string
		size     = units.Bytes(1 << 30)
		diverge  = fraction(0.01)
	)
	cmd := &cobra.Command{
		Use:   "repair",
		Short: "Activation repair of a diverged replica: block-level vs whole-extent copy, beside bare QUIC",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			report, err := bench.RunRepair(cmd.Context(), bench.RepairOptions{
				VolumeBytes: uint64(size),
				Diverge:     float64(diverge),
				Progress:    os.Stderr,
			})
			if err != nil {
				return err
			}
			report.WriteTable(cmd.OutOrStdout())
			if jsonPath != "" {
				return bench.WriteJSONFile(jsonPath, report)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&jsonPath, "json", "", "also write the report as JSON to this file")
	cmd.Flags().Var(&size, "size", "volume size")
	cmd.Flags().Var(&diverge, "diverge", "fraction of blocks one replica misses: 1% or 0.01")
	return cmd
}

// fraction is a flag value written as a percentage ("1%") or a plain
// fraction ("0.01").
type fraction float64

func (f *fraction) String() string { return strconv.FormatFloat(float64(*f)*100, 'g', -1, 64) + "%" }

func (f *fraction) Set(s string) error {
	pct := strings.HasSuffix(s, "%")
	v, err := strconv.ParseFloat(strings.TrimSuffix(s, "%"), 64)
	if err != nil {
		return fmt.Errorf("invalid fraction %q: want 1%% or 0.01", s)
	}
	if pct {
		v /= 100
	}
	if v <= 0 || v > 1 {
		return fmt.Errorf("fraction %q: want more than 0 and at most 100%%", s)
	}
	*f = fraction(v)
	return nil
}

func (f *fraction) Type() string { return "fraction" }
