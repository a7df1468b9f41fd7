package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// newVolumeScrubCmd is `tern volume scrub`: activate, read every block of
// every replica against its recorded hash, rewrite the ones that fail from
// a peer's good copy, deactivate.
func newVolumeScrubCmd() *cobra.Command {
	var vf volumeFlags
	cmd := &cobra.Command{
		Use:   "scrub",
		Short: "Read every block of every replica, rewriting those that fail their hash from a good copy",
		Long: "Activate the volume with --gen, then read every block of each Active replica and check it " +
			"against its recorded hash (a bit flipped at rest shows no other way until it is read there); a " +
			"block that fails is rewritten on that replica from a peer's good copy. Prints the replicas " +
			"scrubbed, the blocks read and the blocks rewritten, then deactivates. With --layout ec:K+M, every " +
			"stripe is read from every shard, checked against the block hashes and its parity, and each wrong " +
			"block rewritten from the stripe.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := vf.prepare(cmd.Context(), nil, nil)
			if err != nil {
				return err
			}
			defer p.close()
			if err := p.activate(cmd.Context()); err != nil {
				return err
			}
			if p.ev != nil {
				rep, err := p.ev.Scrub(cmd.Context())
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "scrubbed %d stripes of %s: rewrote %d blocks (%d stripes with one bad block, %d with parity recomputed)\n",
					rep.StripesChecked, p.ev.Layout(), rep.BlocksRewritten, rep.Outliers, rep.ParityRecomputed)
				return p.close()
			}
			up := p.up
			rep, err := up.Scrub(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "scrubbed replicas %v: read %d blocks, rewrote %d\n", rep.Replicas, rep.Blocks, rep.Rewritten)
			return up.Close()
		},
	}
	vf.register(cmd)
	return cmd
}
