package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tern/instance/runner"
)

func init() { rootCmd.AddCommand(newMigrateCmd()) }

func newMigrateCmd() *cobra.Command {
	var (
		from, to, certs string
		opts            runner.MigrateOptions
	)
	cmd := &cobra.Command{
		Use:   "migrate --from SRC_API --to DST_API [--downtime-target 30ms] [--same-host]",
		Short: "Live-migrate the instance of one tern vmm serve to another",
		Long: `Compare both VMMs' versions (GET /v1/version) and refuse, naming the
difference, when they share no migration protocol or the target does not
read a device state the source writes; then ensure DST_API's instance as a
migration target of SRC_API's and follow both monitors: a progress bar on
a terminal, JSON lines otherwise. It prints the total time, downtime,
bytes sent and rounds, and exits 0 only once the target runs and the
source is destroyed; on failure it names the phase and the reason.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if from == "" || to == "" {
				return errors.New("--from and --to are required")
			}
			src, err := (&instanceFlags{server: from, certs: certs}).client()
			if err != nil {
				return fmt.Errorf("--from: %w", err)
			}
			dst, err := src.At(to)
			if err != nil {
				return fmt.Errorf("--to: %w", err)
			}
			out := cmd.OutOrStdout()
			isTTY := false
			if f, ok := out.(*os.File); ok {
				isTTY = term.IsTerminal(int(f.Fd()))
			}
			p := newMigratePrinter(out, isTTY)
			opts.Progress = p.Event
			r, err := runner.Migrate(cmd.Context(), src, dst, opts)
			p.Finish()
			if err != nil {
				return describeAPIError(err)
			}
			return p.Result(r)
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the source vmm's API: http://host:port or host:port")
	cmd.Flags().StringVar(&to, "to", "", "the target vmm's API: http://host:port or host:port")
	cmd.Flags().StringVar(&certs, "certs", "", "certificate directory for vmms serving --api-tls")
	cmd.Flags().DurationVar(&opts.DowntimeTarget, "downtime-target", 30*time.Millisecond, "the longest pause the source aims for")
	cmd.Flags().BoolVar(&opts.SameHost, "same-host", false, "hand guest memory over as memfds (both vmms on this host): no page is copied")
	cmd.Flags().DurationVar(&opts.StallTimeout, "stall-timeout", runner.DefaultStallTimeout, "give up when neither side publishes anything for this long")
	return cmd
}
