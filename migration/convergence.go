package migration

import (
	"math"
	"time"
)

// DefaultDowntimeTarget is the downtime the source aims for when the policy
// does not say (DESIGN §6).
const DefaultDowntimeTarget = 30 * time.Millisecond

// DefaultMaxRounds bounds the pre-copy rounds (the full copy counts as the
// first) when the policy does not say.
const DefaultMaxRounds = 10

// Policy decides when pre-copy stops. Zero fields take the defaults.
type Policy struct {
	// DowntimeTarget is the longest pause the source plans for: it pauses
	// once the dirty bytes would move in this time at the measured
	// bandwidth.
	DowntimeTarget time.Duration
	// MaxRounds stops pre-copy after this many rounds whatever the dirty
	// rate (a guest dirtying faster than the link never converges).
	MaxRounds int
}

func (p Policy) withDefaults() Policy {
	if p.DowntimeTarget <= 0 {
		p.DowntimeTarget = DefaultDowntimeTarget
	}
	if p.MaxRounds <= 0 {
		p.MaxRounds = DefaultMaxRounds
	}
	return p
}

// Observation is what the source knows after a pre-copy round.
type Observation struct {
	// RoundsDone counts the rounds sent, the full copy included (≥ 1).
	RoundsDone int
	// DirtyBytes is what the guest dirtied since the last round began:
	// what the next round, or the paused copy, must send.
	DirtyBytes uint64
	// BandwidthBytesPerSec is the measured transfer rate (0: unknown).
	BandwidthBytesPerSec float64
}

// Reason says why Decide chose what it chose.
type Reason int

// The reasons of a Decision.
const (
	// ReasonIterate: the dirty bytes would take longer than the target.
	ReasonIterate Reason = iota
	// ReasonClean: nothing is dirty.
	ReasonClean
	// ReasonConverged: the dirty bytes fit the downtime target.
	ReasonConverged
	// ReasonRoundLimit: MaxRounds rounds were sent.
	ReasonRoundLimit
)

func (r Reason) String() string {
	switch r {
	case ReasonIterate:
		return "iterate"
	case ReasonClean:
		return "clean"
	case ReasonConverged:
		return "converged"
	case ReasonRoundLimit:
		return "round limit"
	}
	return "unknown"
}

// Decision is what the source does next.
type Decision struct {
	// Pause reports that pre-copy is over: pause and send the rest.
	Pause bool
	// Reason says why.
	Reason Reason
	// EstimatedDowntime is DirtyBytes at the measured bandwidth; it
	// saturates at math.MaxInt64 when the bandwidth is unknown or tiny.
	EstimatedDowntime time.Duration
}

// EstimateDowntime is the time dirtyBytes take at bytesPerSec, saturating
// (an unknown bandwidth with dirty bytes is "forever").
func EstimateDowntime(dirtyBytes uint64, bytesPerSec float64) time.Duration {
	if dirtyBytes == 0 {
		return 0
	}
	if !(bytesPerSec > 0) {
		return time.Duration(math.MaxInt64)
	}
	ns := float64(dirtyBytes) / bytesPerSec * float64(time.Second)
	if ns >= float64(math.MaxInt64) || math.IsNaN(ns) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(ns)
}

// Decide is the convergence rule (Cloud Hypervisor's and QEMU's): pause
// when nothing is dirty, when the dirty bytes would move within the
// downtime target at the measured bandwidth, or after MaxRounds rounds;
// otherwise send another round. It is a pure function of its inputs.
func Decide(p Policy, o Observation) Decision {
	p = p.withDefaults()
	d := Decision{EstimatedDowntime: EstimateDowntime(o.DirtyBytes, o.BandwidthBytesPerSec)}
	switch {
	case o.DirtyBytes == 0:
		d.Pause, d.Reason = true, ReasonClean
	case d.EstimatedDowntime <= p.DowntimeTarget:
		d.Pause, d.Reason = true, ReasonConverged
	case o.RoundsDone >= p.MaxRounds:
		d.Pause, d.Reason = true, ReasonRoundLimit
	default:
		d.Reason = ReasonIterate
	}
	return d
}
