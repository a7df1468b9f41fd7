package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"tern/volume/sim"
)

func newBenchSimCmd() *cobra.Command {
	var (
		seeds   int
		first   uint64
		workers int
		whole   bool
	)
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "A campaign of the deterministic volume simulation: runs, events, faults by kind, violations",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			faults := sim.DefaultProbabilities()
			if whole {
				faults = sim.WholeVolumeCrashProbabilities()
			}
			rep := sim.CampaignWith(faults, first, seeds, workers, func(done int, r sim.Result) {
				if done%50 == 0 || len(r.Violations) > 0 {
					fmt.Fprintf(os.Stderr, "%d/%d %s\n", done, seeds, r.Summary())
				}
			})
			rep.WriteTable(cmd.OutOrStdout())
			if rep.Violations > 0 {
				return fmt.Errorf("run simulation campaign: %d of %d seeds broke an invariant", len(rep.Failing), rep.Runs)
			}
			return nil
		},
	}
	cmd.Flags().IntVar(&seeds, "seeds", 1000, "number of seeds to run")
	cmd.Flags().Uint64Var(&first, "first", 0, "first seed")
	cmd.Flags().IntVar(&workers, "workers", 0, "seeds run in parallel (0: GOMAXPROCS)")
	cmd.Flags().BoolVar(&whole, "whole-volume-crash", false, "also crash every downstairs at once now and then (restart reconciliation)")
	return cmd
}
