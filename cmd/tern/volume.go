package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tern/dataplane/tlsconf"
	"tern/units"
	"tern/volume/upstairs"
	"tern/volume/wire"
)

func init() { rootCmd.AddCommand(newVolumeCmd()) }

// newVolumeCmd is `tern volume`; each subcommand has its own constructor so
// the tree grows by one AddCommand line.
func newVolumeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "volume",
		Short: "Work with a replicated volume through its three downstairs",
	}
	cmd.AddCommand(newVolumeFillCmd(), newVolumeVerifyCmd(), newVolumeStatusCmd(), newVolumeRepairCmd())
	return cmd
}

// volumeFlags are the flags every command that activates a volume takes.
type volumeFlags struct {
	targets    []string
	certs      string
	gen        uint64
	quorumWait time.Duration
}

func (f *volumeFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringSliceVar(&f.targets, "targets", nil, "the three downstairs addresses, host:port,host:port,host:port")
	fs.StringVar(&f.certs, "certs", "", "certificate directory (ca.pem, node.pem, node-key.pem)")
	fs.Uint64Var(&f.gen, "gen", 0, "activation generation; must exceed every earlier one")
	fs.DurationVar(&f.quorumWait, "activation-quorum-wait", upstairs.DefaultActivationQuorumWait,
		"how long to wait for all three downstairs before activating with two")
	for _, name := range []string{"targets", "certs", "gen"} {
		_ = cmd.MarkFlagRequired(name)
	}
}

// activate connects to the volume and activates it.
func (f *volumeFlags) activate(ctx context.Context) (*upstairs.Upstairs, error) {
	bundle, err := tlsconf.Load(f.certs)
	if err != nil {
		return nil, fmt.Errorf("loading certificates: %w", err)
	}
	logger, err := newLogger()
	if err != nil {
		return nil, err
	}
	up, err := upstairs.New(upstairs.Config{
		Targets:              f.targets,
		TLS:                  bundle.ClientConfig(""), // server name: each target's host
		Logger:               logger,
		ActivationQuorumWait: f.quorumWait,
	})
	if err != nil {
		return nil, err
	}
	if err := up.Activate(ctx, wire.Generation(f.gen)); err != nil {
		_ = up.Close()
		return nil, err
	}
	return up, nil
}

// patternFlags choose the deterministic data and the range it covers.
type patternFlags struct {
	seed   uint64
	offset units.Bytes
	length units.Bytes
}

func (f *patternFlags) register(fs *pflag.FlagSet) {
	fs.Uint64Var(&f.seed, "seed", 0, "seed of the pseudo-random data (each block derives from seed and block index)")
	fs.Var(&f.offset, "offset", "first byte of the range (block-aligned; accepts units such as 64MiB)")
	fs.Var(&f.length, "length", "bytes in the range (block-aligned; default: to the end of the volume)")
}

// span resolves the range against the volume: block size, first block and
// block count.
func (f *patternFlags) span(cmd *cobra.Command, up *upstairs.Upstairs) (bs int, first, blocks uint64, err error) {
	region := up.Status().Region
	bs = int(region.BlockSize)
	size := region.Blocks() * uint64(bs)
	off, length := uint64(f.offset), uint64(f.length)
	if !cmd.Flags().Changed("length") {
		if off > size {
			return 0, 0, 0, fmt.Errorf("offset %s: past the end of the %s volume", units.FormatBytes(off), units.FormatBytes(size))
		}
		length = size - off
	}
	switch {
	case off%uint64(bs) != 0 || length%uint64(bs) != 0:
		return 0, 0, 0, fmt.Errorf("offset %d, length %d: not multiples of the %d-byte block: %w", off, length, bs, upstairs.ErrUnaligned)
	case off > size || length > size-off:
		return 0, 0, 0, fmt.Errorf("offset %d, length %d: past the end of the %d-byte volume: %w", off, length, size, upstairs.ErrOutOfRange)
	}
	return bs, off / uint64(bs), length / uint64(bs), nil
}

// chunkBytes is the IO size of fill and verify; volumeWorkers IOs are in
// flight at once.
const (
	chunkBytes    = 1 << 20
	volumeWorkers = 8
)

// chunkFunc handles one chunk of a pattern command: buf holds the blocks
// starting at block, each bs bytes.
type chunkFunc func(ctx context.Context, up *upstairs.Upstairs, buf []byte, bs int, block uint64) error

// runOverRange is the body of fill and verify: activate, resolve the range,
// apply each chunk (volumeWorkers at once), run finish, report, deactivate.
// The command's context is cancelled by SIGINT and SIGTERM (see main).
func runOverRange(cmd *cobra.Command, vf *volumeFlags, pf *patternFlags, verb string, each chunkFunc, finish func(context.Context, *upstairs.Upstairs) error) error {
	ctx := cmd.Context()
	up, err := vf.activate(ctx)
	if err != nil {
		return err
	}
	defer up.Close()
	bs, first, blocks, err := pf.span(cmd, up)
	if err != nil {
		return err
	}
	start := time.Now()
	err = forChunks(ctx, bs, first, blocks, func(buf []byte, block uint64) error {
		return each(ctx, up, buf, bs, block)
	})
	if err != nil {
		return err
	}
	if finish != nil {
		if err := finish(ctx, up); err != nil {
			return err
		}
	}
	report(cmd, verb, bs, first, blocks, time.Since(start))
	return up.Close()
}

func newVolumeFillCmd() *cobra.Command {
	var vf volumeFlags
	var pf patternFlags
	cmd := &cobra.Command{
		Use:   "fill",
		Short: "Write deterministic pseudo-random data to a range of the volume, then flush",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			write := func(ctx context.Context, up *upstairs.Upstairs, buf []byte, bs int, block uint64) error {
				upstairs.FillPattern(buf, bs, block, pf.seed)
				if _, err := up.WriteAt(ctx, buf, int64(block)*int64(bs)); err != nil {
					return fmt.Errorf("block %d: %w", block, err)
				}
				return nil
			}
			flush := func(ctx context.Context, up *upstairs.Upstairs) error { return up.Flush(ctx) }
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
			check := func(ctx context.Context, up *upstairs.Upstairs, buf []byte, bs int, block uint64) error {
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
