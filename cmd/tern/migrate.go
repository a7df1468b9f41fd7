package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tern/internal/units"
	"tern/migration"
	"tern/migration/runner"
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
			p := newMigrateProgress(out, isTTY)
			opts.Progress = p.event
			r, err := runner.Migrate(cmd.Context(), src, dst, opts)
			p.finish()
			if err != nil {
				return describeAPIError(err)
			}
			return p.result(r)
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

// migrateProgress shows a migration's events: a bar on a terminal, JSON
// lines otherwise.
type migrateProgress struct {
	out   io.Writer
	isTTY bool
	enc   *json.Encoder
	bar   *progressbar.ProgressBar
	// lastPhase is the phase last described, per side, on a terminal.
	lastPhase map[runner.Side]string
}

func newMigrateProgress(out io.Writer, isTTY bool) *migrateProgress {
	return &migrateProgress{out: out, isTTY: isTTY, enc: json.NewEncoder(out), lastPhase: map[runner.Side]string{}}
}

// migrateEventLine is one JSON line of a non-terminal migrate.
type migrateEventLine struct {
	Side      runner.Side         `json:"side"`
	Gen       uint64              `json:"gen"`
	State     string              `json:"state"`
	Migration *migration.Progress `json:"migration"`
}

func (p *migrateProgress) event(ev runner.MigrationEvent) {
	if !p.isTTY {
		p.enc.Encode(migrateEventLine{Side: ev.Side, Gen: ev.Snapshot.Gen, State: ev.Snapshot.State.String(), Migration: ev.Progress})
		return
	}
	m := ev.Progress
	if ev.Side != runner.SideSource || m == nil {
		if ev.Side == runner.SideTarget && p.lastPhase[ev.Side] != ev.Snapshot.State.String() {
			p.lastPhase[ev.Side] = ev.Snapshot.State.String()
			p.println(fmt.Sprintf("target: %s", ev.Snapshot.State))
		}
		return
	}
	if p.bar == nil {
		p.bar = progressbar.NewOptions64(-1, progressbar.OptionSetWriter(p.out), progressbar.OptionShowBytes(true),
			progressbar.OptionSetWidth(20))
	}
	p.bar.Describe(fmt.Sprintf("%s round %d, %s left, est. downtime %.1f ms", m.Phase, m.Round,
		units.Bytes(m.PagesRemaining*4096), m.EstimatedDowntimeMs))
	p.bar.Set64(int64(m.BytesSent))
}

func (p *migrateProgress) println(s string) {
	if p.bar != nil {
		p.bar.Clear()
	}
	fmt.Fprintln(p.out, s)
}

func (p *migrateProgress) finish() {
	if p.bar != nil {
		p.bar.Finish()
		fmt.Fprintln(p.out)
	}
}

// result prints the finished migration's figures.
func (p *migrateProgress) result(r runner.MigrationResult) error {
	if !p.isTTY {
		return p.enc.Encode(map[string]runner.MigrationResult{"result": r})
	}
	_, err := fmt.Fprintf(p.out, "migrated: total %.1f ms, downtime %.1f ms, %s sent (%d bytes), %d rounds\n",
		r.TotalMs, r.DowntimeMs, units.Bytes(r.BytesSent), r.BytesSent, r.Rounds)
	return err
}
