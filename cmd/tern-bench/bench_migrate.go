package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"tern/bench"
	"tern/cmd/internal/serve"
)

func newBenchMigrateCmd() *cobra.Command {
	var (
		jsonPath string
		sizes    []uint
		rates    []uint
	)
	cmd := &cobra.Command{
		Use:   "migrate [--json FILE] [--sizes 256,1024] [--rates 0,10,100]",
		Short: "Live migration of the dirty guest between two tern vmm serve processes, beside QEMU's",
		Long: `For each memory size and dirtying rate, boot the dirty guest in one tern vmm
serve on loopback and migrate it to a second with what tern migrate runs:
over QUIC, then on the same host (memory handed over as memfds). Report
total time, the downtime the guest measured (its longest progress gap,
with its value however short) and the VMM's, bytes sent and rounds; and,
in the same run, QEMU's live migration of the same ELF guest between two
qemu-system-x86_64 -enable-kvm processes (-incoming on loopback, QMP
migrate), once at QEMU's default settings and once with its max-bandwidth
set to the rate tern's QUIC migration reached (qemu_at_tern_bw_*), each
with the downtime the guest measured under QEMU (qemu_downtime_guest_ms).
Targets compare guest gap with guest gap, and total with total at the
same bandwidth. Rate 0 is the idle dirty guest: it fills its memory once
and then dirties nothing, but still measures its gaps. The guest
verifies its whole memory after each migration. Needs /dev/kvm; refuses
to run inside the emulated test host.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tern, err := serve.TernBinary()
			if err != nil {
				return fmt.Errorf("finding the tern executable: %w", err)
			}
			opts := bench.MigrateOptions{Tern: tern, Progress: os.Stderr}
			for _, s := range sizes {
				opts.SizesMiB = append(opts.SizesMiB, uint64(s))
			}
			for _, r := range rates {
				opts.RatesMiBPerSec = append(opts.RatesMiBPerSec, uint64(r))
			}
			report, err := bench.RunMigrate(cmd.Context(), opts)
			if err != nil {
				return err
			}
			report.WriteTable(cmd.OutOrStdout())
			if jsonPath != "" {
				return bench.WriteJSONFile(jsonPath, report.JSON())
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&jsonPath, "json", "", "also write the scenarios as JSON to this file")
	cmd.Flags().UintSliceVar(&sizes, "sizes", []uint{256, 1024}, "guest memory sizes in MiB")
	cmd.Flags().UintSliceVar(&rates, "rates", []uint{0, 10, 100}, "dirtying rates in MiB/s (0: the idle guest)")
	return cmd
}
