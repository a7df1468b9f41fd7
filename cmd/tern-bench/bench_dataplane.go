package main

import (
	"os"
	"time"

	"github.com/spf13/cobra"

	"tern/bench"
	"tern/bench/planebench"
)

func newBenchDataplaneCmd() *cobra.Command {
	var (
		jsonPath   string
		duration   time.Duration
		roundTrips int
	)
	cmd := &cobra.Command{
		Use:   "dataplane [--json FILE]",
		Short: "UDP latency and throughput between two VMs through the eBPF data plane vs a plain routed veth path",
		Long: `Build two hosts as network namespaces joined by an underlay bridge, a VM
stand-in on each (a namespace behind a veth, the VM's TAP), both in VNI 7
through the eBPF data plane, and time UDP round trips (p50, p99) and
throughput from one to the other; in the same run, the same over a plain
routed veth path between the same namespaces (the limit). The JSON has
throughput_ratio and p99_ratio (eBPF / plain) at its top level beside the
raw figures. Needs root.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			report, err := planebench.RunDataplane(cmd.Context(), planebench.DataplaneOptions{
				RoundTrips: roundTrips, Duration: duration, Progress: os.Stderr,
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
	cmd.Flags().DurationVar(&duration, "duration", 5*time.Second, "length of each path's throughput measurement")
	cmd.Flags().IntVar(&roundTrips, "round-trips", 20000, "UDP round trips timed on each path")
	return cmd
}
