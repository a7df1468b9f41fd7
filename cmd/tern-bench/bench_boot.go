package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"tern/bench"
	"tern/cmd/internal/serve"
)

func newBenchBootCmd() *cobra.Command {
	var (
		jsonPath string
		runs     int
	)
	cmd := &cobra.Command{
		Use:   "boot [--json FILE] [--runs 20]",
		Short: "Boot the hello guest: tern vmm run vs QEMU microvm whole process, in-process boot vs bare KVM",
		Long: `Time the hello guest from spawn to exit under tern vmm run and, alternating
in the same run, under qemu-system-x86_64 -enable-kvm -M microvm on the same
ELF (skipped, saying so, without QEMU); then in this process vmm.New to the
guest's boot-timer write, beside a bare KVM baseline (a VM with one page,
a vCPU run to HLT). Medians and 90th percentiles of wall time, CPU time and
peak RSS. Needs /dev/kvm; refuses to run inside the emulated test host.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tern, err := serve.TernBinary()
			if err != nil {
				return fmt.Errorf("finding the tern executable: %w", err)
			}
			report, err := bench.RunBoot(cmd.Context(), bench.BootOptions{Tern: tern, Runs: runs, Progress: os.Stderr})
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
	cmd.Flags().IntVar(&runs, "runs", 20, "samples of each kind")
	return cmd
}
