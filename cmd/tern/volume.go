package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"tern/internal/units"
	"tern/volume"
	"tern/volume/layout"
	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

func init() { rootCmd.AddCommand(newVolumeCmd()) }

// newVolumeCmd is `tern volume`; each subcommand has its own constructor so
// the tree grows by one AddCommand line.
func newVolumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Work with a volume through its downstairs: three replicas, or K+M erasure-coded shards (--layout ec:K+M)",
	}
	cmd.AddCommand(newVolumeFillCmd(), newVolumeVerifyCmd(), newVolumeStatusCmd(), newVolumeRepairCmd(), newVolumeScrubCmd(), newVolumeNBDCmd())
	return cmd
}

// chunkBytes is the IO size of fill and verify; volumeWorkers IOs are in
// flight at once.
const (
	chunkBytes    = 1 << 20
	volumeWorkers = 8
)

// chunkFunc handles one chunk of a pattern command: buf holds the blocks
// starting at block, each bs bytes.
type chunkFunc func(ctx context.Context, up volume.Volume, buf []byte, bs int, block uint64) error

// runOverRange is the body of fill and verify: check the flags and the
// range against the probed region (before anything is activated),
// activate, apply each chunk (volumeWorkers at once, each IO bounded by
// --io-timeout), run finish, report, deactivate. The command's context is
// cancelled by SIGINT and SIGTERM (see main).
func runOverRange(cmd *cobra.Command, vf *volumeFlags, pf *patternFlags, verb string, each chunkFunc, finish func(context.Context, volume.Volume) error) error {
	ctx := cmd.Context()
	pf.lengthSet = cmd.Flags().Changed("length")
	if err := pf.check(); err != nil {
		return err
	}
	var (
		bs            int
		first, blocks uint64
	)
	span := func(region wire.RegionInfo) (err error) {
		bs, first, blocks, err = pf.span(region)
		return err
	}
	// Close flushes what is in flight; past the IO timeout there is
	// no quorum to flush to.
	tune := func(cfg *layout.Config) {
		cfg.DeactivateTimeout = min(pf.ioTimeout, upstairs.DefaultDeactivateTimeout)
	}
	p, err := vf.prepare(ctx, span, tune)
	if err != nil {
		return err
	}
	up := p.io()
	defer up.Close()
	if err := p.activate(ctx); err != nil {
		return err
	}
	var (
		giveUpOnce sync.Once
		gaveUp     error
	)
	// bounded runs one IO under --io-timeout. The first that runs out
	// of it, or of replicas, becomes the command's error, and closes the
	// volume: the other IOs may be waiting on the same dead replicas,
	// and a write is released only once no sender still reads its
	// buffer, which for a replica that vanished is when its connection
	// closes.
	bounded := func(io func(context.Context) error) error {
		ioCtx, cancel := context.WithTimeout(ctx, pf.ioTimeout)
		defer cancel()
		err := io(ioCtx)
		if lost := p.explainIO(ctx, err, pf.ioTimeout); lost != nil {
			giveUpOnce.Do(func() {
				gaveUp = lost
				_ = up.Close()
			})
			return lost
		}
		return err
	}
	start := time.Now()
	err = forChunks(ctx, bs, first, blocks, func(buf []byte, block uint64) error {
		return bounded(func(ioCtx context.Context) error { return each(ioCtx, up, buf, bs, block) })
	})
	if err == nil && finish != nil {
		err = bounded(func(ioCtx context.Context) error { return finish(ioCtx, up) })
	}
	if gaveUp != nil {
		return gaveUp // not an IO that failed for being cut short by it
	}
	if err != nil {
		return err
	}
	report(cmd, verb, bs, first, blocks, time.Since(start))
	return up.Close()
}

// ioFailed explains an IO that ran out of --io-timeout, or that the
// upstairs failed for want of a quorum, by naming the replicas lost: those
// no longer active, and active ones that still owe replies. It returns nil
// for any other outcome.
func ioFailed(ctx context.Context, up *upstairs.Upstairs, err error, ioTimeout time.Duration) error {
	var why string
	switch {
	case err == nil || ctx.Err() != nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded):
		why = fmt.Sprintf("giving up after --io-timeout %v without a quorum", ioTimeout)
	case errors.Is(err, upstairs.ErrNotEnoughReplicas):
		why = "lost the quorum"
	default:
		return nil
	}
	var lost []string
	for i, r := range up.Status().Replicas {
		switch {
		case r.State != engine.ReplicaActive && (r.FaultReason != "" || r.LastError != ""):
			lost = append(lost, fmt.Sprintf("replica %d (%s): %s: %s", i, r.Target, r.State, replicaWhy(r)))
		case r.State != engine.ReplicaActive:
			lost = append(lost, fmt.Sprintf("replica %d (%s): %s", i, r.Target, r.State))
		case r.OutstandingJobs > 0:
			lost = append(lost, fmt.Sprintf("replica %d (%s): no reply to %d requests", i, r.Target, r.OutstandingJobs))
		}
	}
	if len(lost) == 0 {
		return fmt.Errorf("%s: %w", why, err)
	}
	return fmt.Errorf("%s: lost %s", why, strings.Join(lost, "; "))
}

func newVolumeFillCmd() *cobra.Command {
	var vf volumeFlags
	var pf patternFlags
	cmd := &cobra.Command{
		Use:   "fill",
		Short: "Write deterministic pseudo-random data to a range of the volume, then flush",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			write := func(ctx context.Context, up volume.Volume, buf []byte, bs int, block uint64) error {
				upstairs.FillPattern(buf, bs, block, pf.seed)
				if _, err := up.WriteAt(ctx, buf, int64(block)*int64(bs)); err != nil {
					return fmt.Errorf("block %d: %w", block, err)
				}
				return nil
			}
			flush := func(ctx context.Context, up volume.Volume) error { return up.Flush(ctx) }
			return runOverRange(cmd, &vf, &pf, "filled", write, flush)
		},
	}
	vf.register(cmd)
	pf.register(cmd.Flags())
	return cmd
}

func newVolumeVerifyCmd() *cobra.Command {
	var vf volumeFlags
	var pf patternFlags
	cmd := &cobra.Command{
		Use:   "verify",
		Short: "Read a range of the volume back and check it against the data fill wrote",
		Long: "Read a range of the volume back and check every block against the data `tern volume fill` " +
			"writes for the same seed; fails naming the first bad block (\"block N: ...\").",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			check := func(ctx context.Context, up volume.Volume, buf []byte, bs int, block uint64) error {
				if _, err := up.ReadAt(ctx, buf, int64(block)*int64(bs)); err != nil {
					return fmt.Errorf("block %d: %w", block, err)
				}
				if bad, ok := upstairs.CheckPattern(buf, bs, block, pf.seed, nil); ok {
					return fmt.Errorf("block %d: data does not match seed %d", bad, pf.seed)
				}
				return nil
			}
			return runOverRange(cmd, &vf, &pf, "verified", check, nil)
		},
	}
	vf.register(cmd)
	pf.register(cmd.Flags())
	return cmd
}

// forChunks runs fn over [first, first+blocks) in chunks with several in
// flight. On failure it returns the error of the lowest failing chunk, so
// "the first bad block" is the first in volume order.
func forChunks(ctx context.Context, bs int, first, blocks uint64, fn func(buf []byte, block uint64) error) error {
	per := uint64(max(chunkBytes/bs, 1))
	chunks := (blocks + per - 1) / per
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu       sync.Mutex
		next     uint64
		failedAt = chunks
		failErr  error
		wg       sync.WaitGroup
	)
	for range min(uint64(volumeWorkers), chunks) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, per*uint64(bs))
			for {
				mu.Lock()
				c := next
				next++
				stop := c >= failedAt
				mu.Unlock()
				if stop || ctx.Err() != nil {
					return
				}
				block := first + c*per
				n := min(per, first+blocks-block)
				if err := fn(buf[:n*uint64(bs)], block); err != nil {
					mu.Lock()
					if c < failedAt {
						failedAt, failErr = c, err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if failErr != nil {
		return failErr
	}
	return ctx.Err()
}

func report(cmd *cobra.Command, verb string, bs int, first, blocks uint64, took time.Duration) {
	bytes := blocks * uint64(bs)
	rate := float64(bytes) / (1 << 20) / max(took.Seconds(), 1e-9)
	fmt.Fprintf(cmd.OutOrStdout(), "%s %s at offset %s (blocks %d-%d) in %v, %.1f MiB/s\n",
		verb, units.FormatBytes(bytes), units.FormatBytes(first*uint64(bs)), first, first+blocks-1, took.Round(time.Millisecond), rate)
}

// replicaWhy says why a replica left the volume (its fault reason) and,
// when a later reconnect failed differently, its latest error too.
func replicaWhy(r upstairs.ReplicaStatus) string {
	switch {
	case r.FaultReason == "":
		return r.LastError
	case r.LastError == "" || r.LastError == r.FaultReason:
		return r.FaultReason
	}
	return fmt.Sprintf("%s (latest: %s)", r.FaultReason, r.LastError)
}
