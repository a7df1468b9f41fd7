package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"tern/volume"
	"tern/volume/ec"
	"tern/volume/upstairs/engine"
)

// io is the prepared volume, whichever its layout.
func (p *preparedVolume) io() volume.Volume { return p.vol }

// close closes the prepared volume, whichever its layout.
func (p *preparedVolume) close() error { return p.vol.Close() }

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
