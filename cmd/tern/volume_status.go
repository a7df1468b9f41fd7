package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"tern/internal/tlsconf"
	"tern/internal/units"
	"tern/volume/inspect"
)

// newVolumeStatusCmd is `tern volume status`: a read-only look at the
// replicas that never fences the active upstairs. Extents that disagree
// are a finding (what repair is for); the command fails when no replica
// answered or when replicas serve different regions (uuid or geometry),
// which no repair can fix.
func newVolumeStatusCmd() *cobra.Command {
	var (
		targets    []string
		certs      string
		asJSON     bool
		timeout    time.Duration
		quorumWait time.Duration
		layout     string
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Report each replica's reachability, region and how many extents disagree (read-only)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(targets) == 0 {
				return errors.New("--targets is required")
			}
			l, err := parseLayout(layout)
			if err != nil {
				return err
			}
			if problems := checkTargets(targets, layout); len(problems) > 0 {
				return problemsError(problems)
			}
			bundle, err := tlsconf.Load(certs)
			if err != nil {
				return fmt.Errorf("loading certificates: %w", err)
			}
			rep, err := inspect.Probe(cmd.Context(), targets, bundle.ClientConfig(""), timeout)
			if asJSON && rep != nil {
				enc := json.NewEncoder(cmd.OutOrStdout())
				if jerr := enc.Encode(rep); jerr != nil && err == nil {
					err = jerr
				}
			} else if rep != nil {
				printStatus(cmd, rep)
				if _, isEC := l.EC(); isEC && rep.GeometryMismatch == "" {
					// A flush stamps only the extents it covers, so the
					// shards of a stripe carry different versions.
					fmt.Fprintf(cmd.OutOrStdout(), "layout %s: extents disagree between shards wherever a flush covered some of them; scrub checks the stripes\n", layout)
				}
			}
			if err == nil && rep.GeometryMismatch != "" {
				err = fmt.Errorf("replicas disagree on the region: %s", rep.GeometryMismatch)
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.StringSliceVar(&targets, "targets", nil, "the downstairs addresses, host:port,…: three replicas, or K+M shards with --layout ec:K+M")
	registerLayout(fs, &layout)
	fs.StringVar(&certs, "certs", "", "certificate directory (ca.pem, node.pem, node-key.pem)")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object instead of a table")
	fs.DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for each replica")
	// Accepted like every volume command's; status never activates, so it
	// has nothing to wait for.
	fs.DurationVar(&quorumWait, "activation-quorum-wait", 5*time.Second, "accepted for symmetry with the other volume commands; unused")
	_ = cmd.MarkFlagRequired("targets")
	_ = cmd.MarkFlagRequired("certs")
	return cmd
}

func printStatus(cmd *cobra.Command, rep *inspect.Report) {
	w := cmd.OutOrStdout()
	for _, r := range rep.Replicas {
		if !r.Reachable {
			fmt.Fprintf(w, "%-22s unreachable: %s\n", r.Target, r.Error)
			continue
		}
		fmt.Fprintf(w, "%-22s reachable  region %s  %d × %d blocks of %s  dirty extents %d\n",
			r.Target, r.Region.UUID, r.Region.ExtentCount, r.Region.ExtentBlocks, units.FormatBytes(uint64(r.Region.BlockSize)), r.DirtyExtents)
	}
	if rep.GeometryMismatch != "" {
		return // the command's error names it
	}
	fmt.Fprintf(w, "extents: %d total, %d disagreeing\n", rep.ExtentsTotal, rep.ExtentsDisagreeing)
}
