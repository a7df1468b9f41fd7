package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tern/internal/units"
	"tern/volume/ec"
	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
)

// newVolumeRepairCmd is `tern volume repair`: activate (which reconciles
// the replicas block by block), report progress, deactivate.
func newVolumeRepairCmd() *cobra.Command {
	var (
		vf     volumeFlags
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "repair",
		Short: "Activate a volume to reconcile its replicas, showing progress, then deactivate",
		Long: "Activate the volume with --gen, which compares every extent's version across the replicas and " +
			"copies only the blocks that differ, then deactivate. Progress is a bar on a terminal; with --json, " +
			"one progress object per line on stdout, the last being the final one, and the summary on stderr.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := vf.prepare(cmd.Context(), nil, nil)
			if err != nil {
				return err
			}
			if p.ev != nil {
				return repairEC(cmd, p, asJSON)
			}
			up := p.up
			defer up.Close()
			updates, cancel := up.SubscribeActivation(64)
			defer cancel()
			shown := make(chan reconcile.Progress, 1)
			go func() {
				shown <- showProgress(cmd.OutOrStdout(), updates, asJSON)
			}()
			actErr := p.activate(cmd.Context())
			var final reconcile.Progress
			if actErr == nil {
				final = <-shown
			} else {
				cancel()
				final = <-shown
			}
			stats := up.RepairStats()
			summary := cmd.ErrOrStderr()
			if actErr != nil {
				fmt.Fprintf(summary, "repair failed in phase %s after %d of %d extents\n", final.Phase, final.ExtentsDone, final.ExtentsTotal)
				return actErr
			}
			fmt.Fprintf(summary, "repaired %d of %d extents: compared %d blocks, copied %s in %.2fs\n",
				final.ExtentsDone, final.ExtentsTotal, final.BlocksCompared,
				units.FormatBytes(stats.BytesCopied), final.UpdatedAt.Sub(final.StartedAt).Seconds())
			for i, r := range up.Status().Replicas {
				if r.State != engine.ReplicaActive {
					fmt.Fprintf(summary, "replica %d (%s) is %s: it was not repaired\n", i, r.Target, r.State)
				}
			}
			return up.Close()
		},
	}
	vf.register(cmd)
	cmd.Flags().BoolVar(&asJSON, "json", false, "print one progress object per line on stdout instead of a bar")
	return cmd
}

// showProgress renders every update until the channel closes and returns
// the last one: JSON lines, a bar on a terminal, or nothing otherwise.
func showProgress(w io.Writer, updates <-chan reconcile.Progress, asJSON bool) reconcile.Progress {
	var last reconcile.Progress
	enc := json.NewEncoder(w)
	var bar *progressbar.ProgressBar
	onTerminal := !asJSON && w == io.Writer(os.Stdout) && term.IsTerminal(int(os.Stdout.Fd()))
	for p := range updates {
		last = p
		switch {
		case asJSON:
			enc.Encode(p)
		case onTerminal:
			// The bar counts extents, whose total is known once the plan
			// is made; bytes still to copy grow as divergence is found,
			// so they go in the description.
			if bar == nil && p.ExtentsTotal > 0 {
				bar = progressbar.NewOptions64(int64(p.ExtentsTotal),
					progressbar.OptionSetWriter(w),
					progressbar.OptionSetWidth(30),
					progressbar.OptionShowCount(),
					progressbar.OptionSetPredictTime(false),
					progressbar.OptionThrottle(100*time.Millisecond))
			}
			if bar != nil {
				bar.Describe(fmt.Sprintf("%-9s %.1f of %.1f MiB copied, %.1f MiB/s", p.Phase,
					float64(p.BytesDone)/(1<<20), float64(p.BytesTotal)/(1<<20), p.BytesPerSec/(1<<20)))
				bar.Set64(int64(p.ExtentsDone))
			}
		}
	}
	if bar != nil {
		bar.Finish()
		fmt.Fprintln(w)
	}
	return last
}

// repairEC is `tern volume repair --layout ec:K+M`: activate (which
// resolves the stripes of extents whose versions differ between shards),
// then wait for every connected shard's live repair (a shard back from a
// crash rebuilds the blocks it may have lost), showing the activation's
// progress and then each repair's final progress.
func repairEC(cmd *cobra.Command, p *preparedVolume, asJSON bool) error {
	v := p.ev
	defer v.Close()
	updates, cancel := v.SubscribeActivation(64)
	defer cancel()
	shown := make(chan reconcile.Progress, 1)
	go func() { shown <- showProgress(cmd.OutOrStdout(), updates, asJSON) }()
	actErr := p.activate(cmd.Context())
	if actErr != nil {
		cancel()
	}
	final := <-shown
	summary := cmd.ErrOrStderr()
	if actErr != nil {
		fmt.Fprintf(summary, "repair failed in phase %s after %d of %d extents\n", final.Phase, final.ExtentsDone, final.ExtentsTotal)
		return actErr
	}
	fmt.Fprintf(summary, "activation reconciled %d of %d extents: compared %d blocks, rewrote %s\n",
		final.ExtentsDone, final.ExtentsTotal, final.BlocksCompared, units.FormatBytes(final.BytesDone))
	st := waitRepairedEC(cmd.Context(), v)
	enc := json.NewEncoder(cmd.OutOrStdout())
	for i, s := range st.Shards {
		switch {
		case s.Repair != nil:
			if asJSON {
				enc.Encode(s.Repair)
			}
			fmt.Fprintf(summary, "shard %d (%s) rebuilt: %d extents, compared %d blocks, rewrote %s\n",
				i, s.Target, s.Repair.ExtentsDone, s.Repair.BlocksCompared, units.FormatBytes(s.Repair.BytesDone))
		case s.State != ec.ShardActive:
			fmt.Fprintf(summary, "shard %d (%s) is %s: it was not repaired\n", i, s.Target, s.State)
		}
	}
	return v.Close()
}
