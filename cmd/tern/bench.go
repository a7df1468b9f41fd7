package main

import (
	"os"
	"time"

	"github.com/spf13/cobra"

	"tern/bench"
	"tern/units"
)

func init() { rootCmd.AddCommand(newBenchCmd()) }

func newBenchCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure tern beside the limits of this machine (volume IO, repair)",
	}
	cmd.AddCommand(newBenchVolumeCmd())
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
