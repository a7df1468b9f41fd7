package main

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"tern/internal/units"
	"tern/volume/layout"
	"tern/volume/upstairs"
	"tern/volume/wire"
)

// Defaults of the volume commands' timeouts.
const (
	// defaultActivateTimeout is how long a command keeps trying to reach
	// its replicas: long enough for a downstairs that is starting up.
	defaultActivateTimeout = 30 * time.Second
	// defaultIOTimeout is how long fill and verify wait for one IO. The
	// upstairs waits for a quorum forever (it never acks with one
	// replica and resumes when a second is back); a command gives up.
	defaultIOTimeout = 60 * time.Second
)

// minBlockSize is the smallest block size a region can have: an offset or
// length that is not a multiple of it is wrong on every volume.
const minBlockSize = 512

// volumeFlags are the flags every command that activates a volume takes.
type volumeFlags struct {
	targets         []string
	certs           string
	gen             uint64
	quorumWait      time.Duration
	activateTimeout time.Duration
	// layout is --layout: "replicated" or "ec:K+M".
	layout string
}

// layoutReplicated is --layout's default: three replicas.
const layoutReplicated = "replicated"

// parseLayout reads --layout, or says what is wrong with it.
func parseLayout(flag string) (layout.Layout, error) { return layout.ParseFlag("--layout", flag) }

// registerLayout adds --layout to fs.
func registerLayout(fs *pflag.FlagSet, flag *string) {
	fs.StringVar(flag, "layout", layoutReplicated,
		"replicated (three downstairs) or ec:K+M (erasure-coded: K data and M parity shards, K+M downstairs; ec alone is ec:4+2)")
}

// wantTargets is how many --targets the layout needs and what the
// volume calls each of them; the layout must be valid.
func wantTargets(flag string) (int, string) {
	l, _ := parseLayout(flag)
	return l.Downstairs(), l.Noun()
}

func (f *volumeFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringSliceVar(&f.targets, "targets", nil, "the downstairs addresses, host:port,…: three replicas, or K+M shards with --layout ec:K+M (data shards first)")
	registerLayout(fs, &f.layout)
	fs.StringVar(&f.certs, "certs", "", "certificate directory (ca.pem, node.pem, node-key.pem)")
	fs.Uint64Var(&f.gen, "gen", 0, "activation generation, from 1; must exceed every earlier one")
	fs.DurationVar(&f.quorumWait, "activation-quorum-wait", upstairs.DefaultActivationQuorumWait,
		"how long to wait for every downstairs before activating without the missing ones (with two of three replicas, or K of K+M shards)")
	fs.DurationVar(&f.activateTimeout, "activate-timeout", defaultActivateTimeout,
		"how long to keep trying to reach two replicas (K shards) before giving up")
	for _, name := range []string{"targets", "certs", "gen"} {
		_ = cmd.MarkFlagRequired(name)
	}
}

// check reports, in one line, every problem of the flags that needs no
// replica to find.
func (f *volumeFlags) check() error {
	var problems []string
	if _, err := parseLayout(f.layout); err != nil {
		problems = append(problems, err.Error())
	} else {
		problems = checkTargets(f.targets, f.layout)
	}
	if f.gen == 0 {
		problems = append(problems, "--gen 0: generations start at 1")
	}
	if f.quorumWait <= 0 {
		problems = append(problems, fmt.Sprintf("--activation-quorum-wait %v: must be positive", f.quorumWait))
	}
	if f.activateTimeout <= 0 {
		problems = append(problems, fmt.Sprintf("--activate-timeout %v: must be positive", f.activateTimeout))
	}
	return problemsError(problems)
}

// checkTargets checks that there are as many distinct host:port
// addresses with numeric ports as the layout needs (three replicas, or
// K+M shards).
func checkTargets(targets []string, flag string) []string {
	var problems []string
	want, what := wantTargets(flag)
	if len(targets) != want {
		if what == "replica" {
			problems = append(problems, fmt.Sprintf("--targets: want 3 addresses (host:port,host:port,host:port), got %d", len(targets)))
		} else {
			problems = append(problems, fmt.Sprintf("--targets: --layout %s wants %d addresses (one per shard), got %d", flag, want, len(targets)))
		}
	}
	seen := map[string]int{}
	for i, t := range targets {
		host, port, err := net.SplitHostPort(t)
		if err != nil {
			reason := err.Error()
			if ae, ok := err.(*net.AddrError); ok {
				reason = ae.Err
			}
			problems = append(problems, fmt.Sprintf("--targets: %s %d %q: %s", what, i, t, reason))
			continue
		}
		if host == "" {
			problems = append(problems, fmt.Sprintf("--targets: %s %d %q: missing host", what, i, t))
		}
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			problems = append(problems, fmt.Sprintf("--targets: %s %d %q: port %q is not a number from 1 to 65535", what, i, t, port))
		}
		if j, dup := seen[t]; dup {
			problems = append(problems, fmt.Sprintf("--targets: %s %d %q repeats %s %d", what, i, t, what, j))
		}
		seen[t] = i
	}
	return problems
}

// problemsError joins problems into one single-line error, nil if none.
func problemsError(problems []string) error {
	if len(problems) == 0 {
		return nil
	}
	return fmt.Errorf("%s", strings.Join(problems, "; "))
}

// patternFlags choose the deterministic data and the range it covers.
type patternFlags struct {
	seed      uint64
	offset    units.Bytes
	length    units.Bytes
	ioTimeout time.Duration
	// lengthSet is whether --length was given (else: to the end).
	lengthSet bool
}

func (f *patternFlags) register(fs *pflag.FlagSet) {
	fs.Uint64Var(&f.seed, "seed", 0, "seed of the pseudo-random data (each block derives from seed and block index)")
	fs.Var(&f.offset, "offset", "first byte of the range (block-aligned; accepts units such as 64MiB)")
	fs.Var(&f.length, "length", "bytes in the range (block-aligned; default: to the end of the volume)")
	// Its zero value is not a length of zero but "to the end", which the
	// usage already says.
	fs.Lookup("length").DefValue = ""
	fs.DurationVar(&f.ioTimeout, "io-timeout", defaultIOTimeout,
		"how long one IO may wait (for a quorum of replicas) before the command gives up")
}

// check reports the problems of the range that hold on every volume: an
// offset or length that no block size divides, an empty range, a
// non-positive timeout.
func (f *patternFlags) check() error {
	var problems []string
	if f.ioTimeout <= 0 {
		problems = append(problems, fmt.Sprintf("--io-timeout %v: must be positive", f.ioTimeout))
	}
	if f.lengthSet && f.length == 0 {
		problems = append(problems, "--length 0B: the range is empty")
	}
	if uint64(f.offset)%minBlockSize != 0 {
		problems = append(problems, fmt.Sprintf("--offset %v: not block-aligned on any volume (block sizes are powers of two from %s)", f.offset, units.FormatBytes(minBlockSize)))
	}
	if f.lengthSet && uint64(f.length)%minBlockSize != 0 {
		problems = append(problems, fmt.Sprintf("--length %v: not block-aligned on any volume (block sizes are powers of two from %s)", f.length, units.FormatBytes(minBlockSize)))
	}
	return problemsError(problems)
}

// checkAligned names the flags that are not multiples of bs.
func (f *patternFlags) checkAligned(bs uint64) error {
	var bad []string
	if uint64(f.offset)%bs != 0 {
		bad = append(bad, fmt.Sprintf("--offset %v", f.offset))
	}
	if f.lengthSet && uint64(f.length)%bs != 0 {
		bad = append(bad, fmt.Sprintf("--length %v", f.length))
	}
	switch len(bad) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%s: not a multiple of the %s block size", bad[0], units.FormatBytes(bs))
	default:
		return fmt.Errorf("%s: not multiples of the %s block size", strings.Join(bad, ", "), units.FormatBytes(bs))
	}
}

// span resolves the range against the region's geometry: block size,
// first block and block count. It needs only the geometry, so it runs
// before activation.
func (f *patternFlags) span(region wire.RegionInfo) (bs int, first, blocks uint64, err error) {
	bs = int(region.BlockSize)
	size := region.Blocks() * uint64(bs)
	if err := f.checkAligned(uint64(bs)); err != nil {
		return 0, 0, 0, err
	}
	off, length := uint64(f.offset), uint64(f.length)
	if !f.lengthSet {
		if off >= size {
			return 0, 0, 0, fmt.Errorf("--offset %v: past the end of the %s volume", f.offset, units.FormatBytes(size))
		}
		length = size - off
	} else if off > size || length > size-off {
		return 0, 0, 0, fmt.Errorf("--offset %v, --length %v: past the end of the %s volume", f.offset, f.length, units.FormatBytes(size))
	}
	return bs, off / uint64(bs), length / uint64(bs), nil
}
