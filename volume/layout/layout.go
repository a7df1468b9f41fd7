package layout

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"time"

	"tern/volume"
	"tern/volume/ec"
	"tern/volume/upstairs"
	"tern/volume/wire"
)

// replicatedName is how the CLI spells the three-replica layout.
const replicatedName = "replicated"

// replicas is how many downstairs a replicated volume has.
const replicas = 3

// Layout is how a volume spreads over its downstairs: three replicas (the
// zero Layout), or K+M erasure-coded shards.
type Layout struct {
	// erasure is the K+M of an erasure-coded layout; zero for replicas.
	erasure ec.Layout
}

// Replicated is the three-replica layout.
var Replicated = Layout{}

// ErasureCoded is the K+M layout l; it must be valid (ec.Layout.Validate).
func ErasureCoded(l ec.Layout) Layout { return Layout{erasure: l} }

// Parse reads a layout as the CLI spells it: "replicated" (or empty) or
// "ec:K+M". An invalid erasure-coded layout wraps ec.ErrInvalidLayout.
func Parse(s string) (Layout, error) {
	if s == "" || s == replicatedName {
		return Replicated, nil
	}
	l, err := ec.ParseLayout(s)
	if err != nil {
		return Layout{}, err
	}
	return ErasureCoded(l), nil
}

// ParseFlag is Parse for a command-line flag's value: its error names
// the flag and says what it takes, the same words for every command.
func ParseFlag(flag, s string) (Layout, error) {
	l, err := Parse(s)
	if err != nil {
		return Layout{}, fmt.Errorf("%s %q: want replicated or ec:K+M (K data shards from %d to %d, M parity from %d to %d)",
			flag, s, ec.MinData, ec.MaxData, ec.MinParity, ec.MaxParity)
	}
	return l, nil
}

// String is the layout as Parse reads it.
func (l Layout) String() string {
	if e, ok := l.EC(); ok {
		return e.String()
	}
	return replicatedName
}

// EC returns an erasure-coded layout's K+M, false for replicas.
func (l Layout) EC() (ec.Layout, bool) { return l.erasure, l.erasure != (ec.Layout{}) }

// Downstairs is how many downstairs (replicas or shards) the layout needs.
func (l Layout) Downstairs() int {
	if e, ok := l.EC(); ok {
		return e.Shards()
	}
	return replicas
}

// Quorum is how many downstairs must answer for the volume to activate:
// two replicas, or K shards.
func (l Layout) Quorum() int {
	if e, ok := l.EC(); ok {
		return e.Data
	}
	return 2
}

// Noun names one downstairs of the layout: "replica" or "shard".
func (l Layout) Noun() string {
	if _, ok := l.EC(); ok {
		return "shard"
	}
	return "replica"
}

// ClientRegion is the geometry the client sees of a volume whose
// downstairs serve region: the region itself for replicas; for K+M
// shards, K shards' blocks but each shard's metadata block, as one run
// (only BlockSize and Blocks() mean anything in it).
func (l Layout) ClientRegion(region wire.RegionInfo) wire.RegionInfo {
	e, ok := l.EC()
	if !ok {
		return region
	}
	return wire.RegionInfo{UUID: region.UUID, BlockSize: region.BlockSize, ExtentBlocks: 1,
		ExtentCount: uint32(e.VolumeBlocks(region.Blocks() - 1))}
}

// Config is what Open needs, whichever the layout. Zero optional fields
// take the layout's defaults.
type Config struct {
	// Targets are the downstairs (host:port), Layout.Downstairs() of
	// them; for shards, the data shards first.
	Targets []string
	// TLS is the client side of mutual TLS. Required.
	TLS *tls.Config
	// Region is the region every downstairs must serve (zero fields
	// accept what they agree on).
	Region wire.RegionInfo
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// ActivationQuorumWait is how long Activate waits for every
	// downstairs before it goes ahead with a quorum.
	ActivationQuorumWait time.Duration
	// DeactivateTimeout bounds the flush and drain Close does.
	DeactivateTimeout time.Duration
}

// Open builds the volume of layout l over cfg's downstairs. It starts
// nothing: the volume connects when activated. Its errors are the
// layout's own (wrapping volume.ErrInvalidConfig for a bad Config).
func Open(l Layout, cfg Config) (volume.Volume, error) {
	if e, ok := l.EC(); ok {
		v, err := ec.New(ec.Config{
			Layout: e, Targets: cfg.Targets, TLS: cfg.TLS, Region: cfg.Region, Logger: cfg.Logger,
			ActivationQuorumWait: cfg.ActivationQuorumWait, DeactivateTimeout: cfg.DeactivateTimeout,
		})
		if err != nil {
			return nil, err
		}
		return v, nil
	}
	u, err := upstairs.New(upstairs.Config{
		Targets: cfg.Targets, TLS: cfg.TLS, Region: cfg.Region, Logger: cfg.Logger,
		ActivationQuorumWait: cfg.ActivationQuorumWait, DeactivateTimeout: cfg.DeactivateTimeout,
	})
	if err != nil {
		return nil, err
	}
	return u, nil
}
