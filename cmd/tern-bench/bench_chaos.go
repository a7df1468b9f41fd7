package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"tern/cmd/internal/serve"
	"tern/volume/chaos"
)

// soakRegion is the soak's and the crash campaign's geometry: four 1 MiB
// extents, small enough that every iteration verifies the whole volume.
var soakRegion = chaos.ClusterSpec{ExtentSize: "1MiB", ExtentCount: 4}

// defaultSoakDuration is 30 minutes, or 2 with CI=true.
func defaultSoakDuration() time.Duration {
	if os.Getenv("CI") == "true" {
		return 2 * time.Minute
	}
	return 30 * time.Minute
}

func newBenchSoakCmd() *cobra.Command {
	var (
		duration time.Duration
		seed     uint64
	)
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Start/IO/kill/repair loop on three real downstairs; resources must not grow",
		Long: "Runs three `tern downstairs` processes of this binary on loopback and, until --duration\n" +
			"has passed, starts an upstairs, writes and reads back, SIGKILLs and restarts a replica,\n" +
			"verifies every block and closes, sampling goroutines, fds, UDP sockets and RSS every 2 s.\n" +
			"Fails on a bad block or a figure that keeps growing.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withChaosCluster(func(c *chaos.Cluster) error {
				return runSoak(cmd.Context(), c, duration, seed, cmd.OutOrStdout(), cmd.ErrOrStderr())
			})
		},
	}
	cmd.Flags().DurationVar(&duration, "duration", defaultSoakDuration(), "how long to loop (default 30m, 2m with CI=true)")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "seed of the kill schedule and the workload")
	return cmd
}

func runSoak(ctx context.Context, c *chaos.Cluster, d time.Duration, seed uint64, out, progress io.Writer) error {
	res, err := chaos.RunSoak(ctx, c, chaos.SoakSpec{Duration: d, SampleEvery: 2 * time.Second, Seed: seed,
		RecoverTimeout: 2 * time.Minute}, func(f string, a ...any) { fmt.Fprintf(progress, f+"\n", a...) })
	fmt.Fprintf(out, "soak %v seed %d: %d iterations, %d kills, %d restarts, %d writes acknowledged, %d reads verified, %d violations, %d lost, %d samples\n",
		d, seed, res.Iterations, res.Kills, res.Restarts, res.Workload.WritesAcked, res.Workload.ReadsVerified, res.Violations, res.Lost, len(res.Samples))
	fmt.Fprintf(out, "%-18s %10s %10s %12s %s\n", "figure", "first", "last", "slope/min", "bounded")
	unbounded := 0
	for _, f := range chaos.Figures {
		tr := chaos.TrendOf(res.Samples, f.Value)
		ok := tr.Bounded(f.Slack)
		if !ok {
			unbounded++
		}
		fmt.Fprintf(out, "%-18s %10.1f %10.1f %+12.2f %v\n", f.Name, tr.First, tr.Last, tr.PerMinute, ok)
	}
	if err != nil {
		return err
	}
	if res.Violations > 0 || unbounded > 0 {
		return fmt.Errorf("soak: %d violations, %d figures growing", res.Violations, unbounded)
	}
	return nil
}

func newBenchCrashCmd() *cobra.Command {
	var (
		rounds int
		seed   uint64
	)
	cmd := &cobra.Command{
		Use:   "crash",
		Short: "Crash campaign: SIGKILL real downstairs at seeded random moments under a flushing workload",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withChaosCluster(func(c *chaos.Cluster) error {
				spec := chaos.CrashSpec{Seed: seed, Rounds: rounds, Lanes: 2,
					Lane:           chaos.LaneSpec{MaxIOBlocks: 8, FlushEvery: 4, IOTimeout: 3 * time.Minute},
					MaxAcksBetween: 60, RecoverTimeout: 2 * time.Minute}
				w := chaos.NewWorkload(chaos.BlockSize, c.Blocks(), seed)
				res, err := chaos.RunCrashCampaign(cmd.Context(), c, w, spec, 1,
					func(f string, a ...any) { fmt.Fprintf(cmd.ErrOrStderr(), f+"\n", a...) })
				fmt.Fprintf(cmd.OutOrStdout(), "crash campaign seed %d: %d rounds, %d kills (%d %s, %d %s, %d %s), %d restarts, "+
					"%d writes acknowledged, %d flushes acknowledged, %d blocks verified, %d violations, %d lost\n",
					seed, res.Rounds, res.Kills, res.KillsByKind[chaos.KillOne], chaos.KillOne, res.KillsByKind[chaos.KillTwo], chaos.KillTwo,
					res.KillsByKind[chaos.KillThree], chaos.KillThree, res.Restarts, res.Workload.WritesAcked, res.Workload.FlushesAcked,
					res.Verify.Blocks, res.Violations(), res.Verify.Lost)
				if err != nil {
					return err
				}
				if res.Violations() > 0 {
					return fmt.Errorf("crash campaign: %d violations; first: %s", res.Violations(), res.Verify.First)
				}
				return nil
			})
		},
	}
	cmd.Flags().IntVar(&rounds, "rounds", 50, "kill rounds")
	cmd.Flags().Uint64Var(&seed, "seed", 1, "seed of the kill schedule and the workload")
	return cmd
}

// withChaosCluster creates a cluster of this binary's downstairs in a
// scratch directory, runs f and removes everything.
func withChaosCluster(f func(*chaos.Cluster) error) error {
	bin, err := serve.TernBinary()
	if err != nil {
		return fmt.Errorf("finding tern binary: %w", err)
	}
	dir, err := os.MkdirTemp("", "tern-chaos-")
	if err != nil {
		return fmt.Errorf("creating scratch directory: %w", err)
	}
	defer os.RemoveAll(dir)
	c, err := chaos.NewCluster(bin, dir, soakRegion)
	if err != nil {
		return err
	}
	err = f(c)
	return errors.Join(err, c.StopAll())
}
