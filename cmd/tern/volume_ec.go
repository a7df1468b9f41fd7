package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strings"
	"time"

	"tern/volume/ec"
	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// volumeIO is what the pattern commands, the NBD export and a VM disk
// need of a volume, replicated (*upstairs.Upstairs) or erasure-coded
// (*ec.Volume).
type volumeIO interface {
	ReadAt(ctx context.Context, p []byte, off int64) (int, error)
	WriteAt(ctx context.Context, p []byte, off int64) (int, error)
	Flush(ctx context.Context) error
	Close() error
}

// io is the prepared volume, whichever its layout.
func (p *preparedVolume) io() volumeIO {
	if p.ev != nil {
		return p.ev
	}
	return p.up
}

// close closes the prepared volume, whichever its layout.
func (p *preparedVolume) close() error { return p.io().Close() }

// volumeRegion is the geometry the client sees of an erasure-coded
// volume: K shards' blocks but each shard's metadata block, as one run
// (only BlockSize and Blocks() mean anything in it).
func volumeRegion(shard wire.RegionInfo, l ec.Layout) wire.RegionInfo {
	return wire.RegionInfo{UUID: shard.UUID, BlockSize: shard.BlockSize, ExtentBlocks: 1,
		ExtentCount: uint32(l.VolumeBlocks(shard.Blocks() - 1))}
}

// newEC builds the erasure-coded volume of a probe that reached
// `reached` shards; check runs against the volume's geometry first.
func (p *preparedVolume) newEC(l ec.Layout, tlsConf *tls.Config, reached int, check func(wire.RegionInfo) error) error {
	shardRegion := p.region
	p.region = volumeRegion(shardRegion, l)
	if check != nil {
		if err := check(p.region); err != nil {
			return err
		}
	}
	f := p.flags
	cfg := ec.Config{
		Layout: l, Targets: f.targets, TLS: tlsConf, Region: shardRegion, Logger: p.log,
		ActivationQuorumWait: f.quorumWait,
	}
	if reached < len(f.targets) {
		// The quorum wait was spent probing.
		cfg.ActivationQuorumWait = time.Millisecond
	}
	v, err := ec.New(cfg)
	if err != nil {
		return err
	}
	p.ev = v
	return nil
}

// activateEC activates the erasure-coded volume with --gen within what is
// left of --activate-timeout for the negotiation, and warns once naming
// each shard it runs without.
func (p *preparedVolume) activateEC(ctx context.Context) error {
	timedOut, err := p.negotiateWithin(ctx, p.ev.SubscribeActivation, p.ev.Activate)
	if timedOut {
		return fmt.Errorf("activating volume: not negotiated within --activate-timeout %v: %s",
			p.flags.activateTimeout, shardReasons(p.ev.Status(), p.missing, func(s ec.ShardStatus) bool { return s.State != ec.ShardActive }))
	}
	if err != nil {
		return err
	}
	st := p.ev.Status()
	var out []string
	for i, s := range st.Shards {
		if s.State == ec.ShardOffline || s.State == ec.ShardConnecting {
			out = append(out, fmt.Sprintf("shard %d (%s): %s", i, s.Target, shardReason(s, p.missing[i])))
		}
	}
	if len(out) > 0 {
		p.cliLog.Warn(fmt.Sprintf("running on %d of %d shards: %s", len(st.Shards)-len(out), len(st.Shards), strings.Join(out, "; ")))
	}
	return nil
}

// shardReason says why a shard is not part of the volume.
func shardReason(s ec.ShardStatus, probed string) string {
	switch {
	case probed != "":
		return probed
	case s.FaultReason != "":
		return s.FaultReason
	case s.LastError != "":
		return s.LastError
	}
	return fmt.Sprintf("not connected (%s)", s.State)
}

// shardReasons lists "shard i (addr): reason" for the shards pick selects.
func shardReasons(st ec.Status, probed []string, pick func(ec.ShardStatus) bool) string {
	var out []string
	for i, s := range st.Shards {
		if pick(s) {
			out = append(out, fmt.Sprintf("shard %d (%s): %s", i, s.Target, shardReason(s, probed[i])))
		}
	}
	if len(out) == 0 {
		return "no shard named a reason"
	}
	return strings.Join(out, "; ")
}

// ioFailedEC is ioFailed for an erasure-coded volume: an IO that ran out
// of --io-timeout, or failed for want of K shards, names the shards lost.
func ioFailedEC(ctx context.Context, v *ec.Volume, err error, ioTimeout time.Duration) error {
	var why string
	switch {
	case err == nil || ctx.Err() != nil:
		return nil
	case errors.Is(err, ec.ErrNotEnoughShards), errors.Is(err, context.DeadlineExceeded):
		why = fmt.Sprintf("giving up after --io-timeout %v with fewer than %d shards", ioTimeout, v.Layout().Data)
	default:
		return nil
	}
	lost := shardReasons(v.Status(), make([]string, v.Layout().Shards()), func(s ec.ShardStatus) bool { return s.State == ec.ShardOffline || s.State == ec.ShardConnecting })
	return fmt.Errorf("%s: lost %s", why, lost)
}

// explainIO is ioFailed or ioFailedEC, by the prepared volume's layout.
func (p *preparedVolume) explainIO(ctx context.Context, err error, ioTimeout time.Duration) error {
	if p.ev != nil {
		return ioFailedEC(ctx, p.ev, err, ioTimeout)
	}
	return ioFailed(ctx, p.up, err, ioTimeout)
}

// waitRepairedEC waits until no connected shard is behind any more (its
// live repairs done), at most until ctx ends, and returns the status.
func waitRepairedEC(ctx context.Context, v *ec.Volume) ec.Status {
	for {
		ch := v.StateChanged()
		st := v.Status()
		busy := false
		for _, s := range st.Shards {
			if s.State == ec.ShardRepairing {
				busy = true
			}
		}
		if !busy {
			return st
		}
		select {
		case <-ch:
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return st
		}
	}
}

var _ volumeIO = (*upstairs.Upstairs)(nil)
var _ volumeIO = (*ec.Volume)(nil)

// activeSummary says how many replicas or shards the activated volume
// runs on: "3 of 3 replicas", "6 of 6 shards (ec:4+2)".
func (p *preparedVolume) activeSummary() string {
	if p.ev != nil {
		st := p.ev.Status()
		n := 0
		for _, s := range st.Shards {
			if s.State == ec.ShardActive || s.State == ec.ShardRepairing {
				n++
			}
		}
		return fmt.Sprintf("%d of %d shards (%s)", n, len(st.Shards), st.Layout)
	}
	n := 0
	for _, r := range p.up.Status().Replicas {
		if r.State == engine.ReplicaActive {
			n++
		}
	}
	return fmt.Sprintf("%d of 3 replicas", n)
}
