package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"tern/bench"
	"tern/internal/units"
	"tern/volume/layout"
)

// newBenchECCmd is `tern bench ec`: a three-replica volume beside an
// erasure-coded one of the same size, in one run.
func newBenchECCmd() *cobra.Command {
	var (
		jsonPath   string
		duration   time.Duration
		size       = units.Bytes(256 << 20)
		layoutFlag string
	)
	cmd := &cobra.Command{
		Use:   "ec",
		Short: "A three-replica volume vs an erasure-coded one on loopback: IO, bytes stored, encode cost, rebuild of a lost downstairs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			parsed, err := layout.ParseFlag("--layout", layoutFlag)
			if err != nil {
				return err
			}
			l, isEC := parsed.EC()
			if !isEC {
				return fmt.Errorf("--layout %s: want ec:K+M", layoutFlag)
			}
			report, err := bench.RunEC(cmd.Context(), bench.ECOptions{
				Layout: l, Duration: duration, VolumeBytes: uint64(size), Progress: os.Stderr,
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
	cmd.Flags().Var(&size, "size", "client-visible size of each volume")
	cmd.Flags().StringVar(&layoutFlag, "layout", "ec:4+2", "the erasure-coded volume's layout, ec:K+M")
	return cmd
}
