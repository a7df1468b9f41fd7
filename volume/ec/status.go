package ec

import (
	"tern/volume/ids"
	"tern/volume/reconcile"
	"tern/volume/wire"
)

// Shard states in ShardStatus.State.
const (
	ShardActive     = "active"     // connected, every block current
	ShardRepairing  = "repairing"  // connected, some stripes behind
	ShardOffline    = "offline"    // not connected
	ShardConnecting = "connecting" // not yet part of the activation
)

// Status is a snapshot of the volume for operators.
type Status struct {
	Layout Layout
	// Active is true between a successful Activate and Close or fencing.
	Active bool
	Gen    ids.Generation
	// Region is one shard's region (zero before activation).
	Region wire.RegionInfo
	// SizeBytes is the client-visible size.
	SizeBytes uint64
	Shards    []ShardStatus
	// Err is why IO stopped (fenced, closed), if it did.
	Err        error
	Activation reconcile.Progress
}

// ShardStatus describes one shard.
type ShardStatus struct {
	Target string
	State  string
	// StripesBehind counts stripes whose block on this shard may be wrong
	// and is not yet repaired.
	StripesBehind uint64
	LastError     string
	FaultReason   string
	// Repair is the shard's current or latest repair; nil if none ran.
	Repair *reconcile.Progress
	// Sessions counts the sessions of the shard the volume attached, one
	// more each time it rejoins: a shard that restarted has rejoined once
	// Sessions has grown.
	Sessions uint64
}

// Status returns a snapshot of the volume.
func (v *Volume) Status() Status {
	v.mu.Lock()
	defer v.mu.Unlock()
	s := Status{
		Layout: v.cfg.Layout, Active: v.running && v.stopErr == nil, Gen: v.gen, Region: v.region,
		SizeBytes: v.cfg.Layout.VolumeBlocks(v.stripes) * uint64(v.bs), Err: v.stopErr,
		Activation: v.actTracker.Status(),
	}
	for _, sh := range v.shards {
		st := ShardStatus{Target: sh.target, StripesBehind: sh.missed.count, LastError: sh.lastErr, FaultReason: sh.faultReason, Sessions: sh.sessions}
		switch {
		case sh.sess == nil && !sh.attachedOnce:
			st.State = ShardConnecting
		case sh.sess == nil:
			st.State = ShardOffline
		case sh.missed.count > 0:
			st.State = ShardRepairing
		default:
			st.State = ShardActive
		}
		if sh.repair != nil {
			p := sh.repair.Status()
			st.Repair = &p
		}
		s.Shards = append(s.Shards, st)
	}
	return s
}

// StateChanged returns a channel closed at the next change of any
// shard's state: take it, read Status, and wait on it if Status does not
// show what you wait for yet.
func (v *Volume) StateChanged() <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.stateCh
}

// ActivationProgress is the activation's progress.
func (v *Volume) ActivationProgress() reconcile.Progress { return v.actTracker.Status() }
