package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"tern/bench"
	"tern/cmd/internal/serve"
)

func newBenchStartCmd() *cobra.Command {
	var (
		jsonPath    string
		runs, vmms  int
		slowDiverge = fraction(1)
	)
	cmd := &cobra.Command{
		Use:   "start [--json FILE] [--runs 50]",
		Short: "Ensure-return and ensure→running latency, beside a GET /healthz round trip, on one and on 8 vmm processes",
		Long: `Measure PUT /v1/instance on real tern vmm serve processes: how long the
ensure takes to return and to reach running for an instance with a
file-backed disk, and how long it takes to return for one whose volume
needs a reconciliation of several seconds, beside a GET /healthz round trip
timed in the same run. First on one vmm, then on --vmms at once. Needs
/dev/kvm; refuses to run inside the emulated test host.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tern, err := serve.TernBinary()
			if err != nil {
				return fmt.Errorf("finding the tern executable: %w", err)
			}
			report, err := bench.RunStart(cmd.Context(), bench.StartOptions{
				Tern: tern, Runs: runs, Concurrency: vmms, SlowDiverge: float64(slowDiverge), Progress: os.Stderr,
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
	cmd.Flags().IntVar(&runs, "runs", 50, "ensures of each kind per phase")
	cmd.Flags().IntVar(&vmms, "vmms", 8, "vmm processes of the concurrent phase")
	cmd.Flags().Var(&slowDiverge, "slow-diverge", "fraction of the slow volume's 256 MiB its replicas disagree on: 100% or 1")
	return cmd
}
