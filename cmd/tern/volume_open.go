package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/quic-go/quic-go"

	"tern/cmd/internal/serve"
	"tern/internal/tlsconf"
	"tern/volume"
	"tern/volume/ec"
	"tern/volume/ids"
	"tern/volume/inspect"
	"tern/volume/layout"
	"tern/volume/reconcile"
	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
	"tern/volume/wire"
)

// How the volume commands retry reaching their replicas before activating.
const (
	// reachBackoffMin and reachBackoffMax bound the pause between two
	// read-only probes; it doubles from min to max.
	reachBackoffMin = 100 * time.Millisecond
	reachBackoffMax = 2 * time.Second
	// tlsAttempts is how many probes in a row a replica may fail TLS
	// verification before the command stops retrying it: a certificate
	// from another CA does not fix itself.
	tlsAttempts = 3
)

// preparedVolume is an upstairs that is ready to activate: the flags were
// checked, a read-only probe reached at least two replicas that agree on
// their region, and the caller's checks against that region passed.
// Nothing has been activated yet, so no generation is used up.
type preparedVolume struct {
	// vol is the volume, whichever its layout; up is it as a replicated
	// volume's upstairs (nil for an erasure-coded one) and ev as an
	// erasure-coded volume (nil for replicas), for what only one layout
	// has.
	vol    volume.Volume
	layout layout.Layout
	up     *upstairs.Upstairs
	ev     *ec.Volume
	log    *slog.Logger      // for the upstairs
	cliLog *slog.Logger      // for the command's own warnings
	filter *replicaLogFilter // nil at --log-level debug
	region wire.RegionInfo
	// missing holds, for each replica (shard) the probe could not reach,
	// why.
	missing []string
	// probeWait is how long the last probe waited for each replica.
	probeWait time.Duration
	deadline  time.Time // end of --activate-timeout
	flags     *volumeFlags
}

// prepare checks the flags, probes the replicas read-only until two agree
// on a region (at most --activate-timeout), runs check against that
// region and builds the volume. tune, if not nil, adjusts its Config.
// Every input error is found here, before any activation.
func (f *volumeFlags) prepare(ctx context.Context, check func(wire.RegionInfo) error, tune func(*layout.Config)) (*preparedVolume, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	bundle, err := tlsconf.Load(f.certs)
	if err != nil {
		return nil, fmt.Errorf("loading certificates: %w", err)
	}
	logger, err := newLogger(serve.ClientLogLevel)
	if err != nil {
		return nil, err
	}
	p := &preparedVolume{log: logger, flags: f, deadline: time.Now().Add(f.activateTimeout), missing: make([]string, len(f.targets))}
	if !logger.Enabled(ctx, slog.LevelDebug) {
		p.filter = newReplicaLogFilter(logger.Handler())
		p.log = slog.New(p.filter)
	}
	p.cliLog = p.log.With("component", "cli")
	tlsConf := bundle.ClientConfig("") // server name: each target's host
	rep, err := f.reach(ctx, tlsConf, p)
	if err != nil {
		return nil, fmt.Errorf("activating volume: %w", err)
	}
	reached := 0
	for i, r := range rep.Replicas {
		if r.Reachable {
			reached++
			p.region = regionInfo(r.Region)
		} else {
			p.missing[i] = reachReason(r, p.probeWait)
		}
	}
	l, _ := parseLayout(f.layout) // checked above
	p.layout = l
	// The client sees its own geometry (for shards, K of them); the
	// volume is given the downstairs' region to activate.
	shardRegion := p.region
	p.region = l.ClientRegion(shardRegion)
	if check != nil {
		if err := check(p.region); err != nil {
			return nil, err
		}
	}
	cfg := layout.Config{
		Targets: f.targets,
		TLS:     tlsConf,
		// Activate what was probed and checked, nothing else.
		Region:               shardRegion,
		Logger:               p.log,
		ActivationQuorumWait: f.quorumWait,
	}
	if reached < len(f.targets) {
		// The quorum wait was spent probing; activate with those that
		// answered as soon as they negotiate.
		cfg.ActivationQuorumWait = time.Millisecond
		for i, why := range p.missing {
			if why != "" && p.filter != nil {
				p.filter.quiet(i) // named in the warning after activation
			}
		}
	}
	if tune != nil {
		tune(&cfg)
	}
	if p.vol, err = layout.Open(l, cfg); err != nil {
		return nil, err
	}
	p.up, _ = p.vol.(*upstairs.Upstairs)
	p.ev, _ = p.vol.(*ec.Volume)
	return p, nil
}

// reach probes the replicas read-only until all three answer, or two
// answer and the quorum wait is over, or two can no longer answer
// (TLS verification fails), or --activate-timeout ends. Reachable replicas
// must agree on their region.
func (f *volumeFlags) reach(ctx context.Context, conf *tls.Config, p *preparedVolume) (*inspect.Report, error) {
	start := time.Now()
	quorumAt := start.Add(f.quorumWait)
	tlsFails := make([]int, len(f.targets))
	l, _ := parseLayout(f.layout) // checked by prepare
	need, what := l.Quorum(), l.Noun()+"s"
	warned := false
	backoff := reachBackoffMin
	for {
		// Each probe waits for an answer until the quorum wait ends (a
		// QUIC dial to a port nobody serves gets no answer at all),
		// then up to one backoff step.
		perTry := max(time.Until(quorumAt), reachBackoffMax)
		perTry = min(perTry, max(time.Until(p.deadline), time.Millisecond))
		rep, _ := inspect.Probe(ctx, f.targets, conf, perTry)
		p.probeWait = perTry
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if rep.GeometryMismatch != "" {
			return nil, fmt.Errorf("replicas disagree on the region: %s: %w", rep.GeometryMismatch, upstairs.ErrRegionMismatch)
		}
		reached, hopeless := 0, 0
		for i, r := range rep.Replicas {
			switch {
			case r.Reachable:
				reached++
				tlsFails[i] = 0
			case tlsRefused(r.Err):
				if tlsFails[i]++; tlsFails[i] >= tlsAttempts {
					hopeless++
				}
			default:
				tlsFails[i] = 0
			}
		}
		now := time.Now()
		switch {
		case reached == len(f.targets):
			return rep, nil
		case reached >= need && (!now.Before(quorumAt) || reached+hopeless == len(f.targets)):
			return rep, nil
		case len(f.targets)-hopeless < need:
			// Not transient: no retry until --activate-timeout.
			return nil, fmt.Errorf("%d %s failed the TLS handshake %d times in a row: %s", hopeless, what, tlsAttempts, unreachable(rep, perTry))
		case !now.Before(p.deadline):
			return nil, fmt.Errorf("%d of %d %s reachable within --activate-timeout %v: %s",
				reached, len(f.targets), what, f.activateTimeout, unreachable(rep, perTry))
		}
		if !warned && !now.Before(quorumAt) {
			// Below quorum after the quorum wait: say once per replica
			// what is wrong, then keep trying quietly.
			warned = true
			for i, r := range rep.Replicas {
				if !r.Reachable {
					p.cliLog.Warn(fmt.Sprintf("replica %d (%s) unreachable, retrying until --activate-timeout %v: %s",
						i, r.Target, f.activateTimeout, reachReason(r, perTry)))
				}
			}
		}
		pause := time.NewTimer(min(backoff, max(time.Until(p.deadline), 0)))
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return nil, ctx.Err()
		}
		backoff = min(2*backoff, reachBackoffMax)
	}
}

// activate activates the volume with --gen. The negotiation is bounded by
// what is left of --activate-timeout; reconciliation, once it begins, is
// not. It warns once, naming each replica the volume runs without.
func (p *preparedVolume) activate(ctx context.Context) error {
	if p.ev != nil {
		return p.activateEC(ctx)
	}
	timedOut, err := p.negotiateWithin(ctx, p.up.SubscribeActivation, p.up.Activate)
	if timedOut {
		return fmt.Errorf("activating volume: not negotiated within --activate-timeout %v: %s",
			p.flags.activateTimeout, p.replicaReasons(func(r upstairs.ReplicaStatus) bool { return r.State != engine.ReplicaActive }))
	}
	if err != nil {
		return err
	}
	st := p.up.Status()
	var out []string
	for i, r := range st.Replicas {
		if r.State != engine.ReplicaActive {
			out = append(out, fmt.Sprintf("replica %d (%s): %s", i, r.Target, p.reason(i, r)))
			if p.filter != nil {
				p.filter.quiet(i)
			}
		}
	}
	if len(out) > 0 {
		p.cliLog.Warn(fmt.Sprintf("running on %d of %d replicas: %s", len(st.Replicas)-len(out), len(st.Replicas), strings.Join(out, "; ")))
	}
	return nil
}

// reason says why replica i is not part of the volume: what the probe met,
// else why it was dropped and its latest connection error.
func (p *preparedVolume) reason(i int, r upstairs.ReplicaStatus) string {
	switch {
	case p.missing[i] != "":
		return p.missing[i]
	case r.FaultReason != "" || r.LastError != "":
		return replicaWhy(r)
	}
	return fmt.Sprintf("not connected (%s)", r.State)
}

// replicaReasons lists "replica i (addr): reason" for each replica pick
// selects, joined into one line.
func (p *preparedVolume) replicaReasons(pick func(upstairs.ReplicaStatus) bool) string {
	var out []string
	for i, r := range p.up.Status().Replicas {
		if pick(r) {
			out = append(out, fmt.Sprintf("replica %d (%s): %s", i, r.Target, p.reason(i, r)))
		}
	}
	if len(out) == 0 {
		return "no replica named a reason"
	}
	return strings.Join(out, "; ")
}

// unreachable lists "replica i (addr): reason" for each replica the probe
// did not reach, in one line.
func unreachable(rep *inspect.Report, wait time.Duration) string {
	var out []string
	for i, r := range rep.Replicas {
		if !r.Reachable {
			out = append(out, fmt.Sprintf("replica %d (%s): %s", i, r.Target, reachReason(r, wait)))
		}
	}
	return strings.Join(out, "; ")
}

// reachReason is why a probe that waited wait did not reach r, on one
// line.
func reachReason(r inspect.Replica, wait time.Duration) string {
	if errors.Is(r.Err, context.DeadlineExceeded) {
		// QUIC gets no "connection refused": a port nobody serves
		// looks like a host that is down.
		return fmt.Sprintf("no answer within %v (is a downstairs serving that address?)", wait.Round(100*time.Millisecond))
	}
	if r.Error == "" {
		return "no answer"
	}
	return strings.ReplaceAll(r.Error, "\n", "; ")
}

// tlsRefused reports whether err is a failed TLS handshake: this side
// rejected the peer's certificate, or the peer rejected ours (a QUIC
// crypto error). Neither is transient.
func tlsRefused(err error) bool {
	var verr *tls.CertificateVerificationError
	if errors.As(err, &verr) {
		return true
	}
	var terr *quic.TransportError
	return errors.As(err, &terr) && terr.ErrorCode.IsCryptoError()
}

// regionInfo converts a probed region to the wire form.
func regionInfo(r *inspect.Region) wire.RegionInfo {
	ri := wire.RegionInfo{BlockSize: r.BlockSize, ExtentBlocks: r.ExtentBlocks, ExtentCount: r.ExtentCount}
	if id, err := uuid.Parse(r.UUID); err == nil {
		ri.UUID = id
	}
	return ri
}

// negotiateWithin runs activate at --gen, cancelling it if the
// negotiation (progress phase negotiating, from subscribe) is not over
// within what is left of --activate-timeout; reconciliation, once it
// begins, is not bounded. timedOut says the bound ended it.
func (p *preparedVolume) negotiateWithin(ctx context.Context,
	subscribe func(int) (<-chan reconcile.Progress, func()),
	activate func(context.Context, ids.Generation) error) (timedOut bool, err error) {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	progress, unsubscribe := subscribe(4)
	defer unsubscribe()
	ended := make(chan bool, 1)
	go func() {
		t := time.NewTimer(max(time.Until(p.deadline), time.Second))
		defer t.Stop()
		for {
			select {
			case pr, ok := <-progress:
				if !ok || pr.Phase != reconcile.PhaseNegotiating {
					ended <- false
					return
				}
			case <-t.C:
				cancel()
				ended <- true
				return
			case <-actx.Done():
				ended <- false
				return
			}
		}
	}()
	err = activate(actx, ids.Generation(p.flags.gen))
	cancel()
	return <-ended && ctx.Err() == nil, err
}
