package sim

// faultKind names one kind of injected fault.
type faultKind uint8

const (
	faultReorder faultKind = iota
	faultDelay
	faultDrop
	faultDuplicate
	faultDisconnect
	faultCrash
	faultBitFlip
	faultTakeover
	faultReplace
	// faultCrashAll crashes every downstairs at once (a power cut of the
	// whole volume). Off in DefaultProbabilities, so it does not shift
	// the kept seeds; WholeVolumeCrashProbabilities turns it on.
	faultCrashAll
	faultKinds
)

var faultNames = [faultKinds]string{
	faultReorder:    "reorder",
	faultDelay:      "delay",
	faultDrop:       "drop",
	faultDuplicate:  "duplicate",
	faultDisconnect: "disconnect",
	faultCrash:      "crash",
	faultBitFlip:    "bitflip",
	faultTakeover:   "takeover",
	faultReplace:    "replace",
	faultCrashAll:   "crashall",
}

func (k faultKind) String() string { return faultNames[k] }

// FaultCounts counts injected faults by kind.
type FaultCounts [faultKinds]int

// Total returns the number of faults injected.
func (c FaultCounts) Total() int {
	n := 0
	for _, v := range c {
		n += v
	}
	return n
}

// Add adds d to c.
func (c *FaultCounts) Add(d FaultCounts) {
	for i := range c {
		c[i] += d[i]
	}
}

// Each calls f for every fault kind, in a fixed order.
func (c FaultCounts) Each(f func(kind string, n int)) {
	for k := range faultKinds {
		f(faultKind(k).String(), c[k])
	}
}

// Probabilities gives each fault kind its chance per opportunity: per
// packet for message faults, per scheduler step for the others.
type Probabilities [faultKinds]float64

// DefaultProbabilities are the chances a campaign runs with.
func DefaultProbabilities() Probabilities {
	var p Probabilities
	p[faultReorder] = 0.05
	p[faultDelay] = 0.01
	p[faultDrop] = 0.02
	p[faultDuplicate] = 0.02
	p[faultDisconnect] = 0.004
	p[faultCrash] = 0.002
	p[faultBitFlip] = 0.002
	p[faultTakeover] = 0.0003
	p[faultReplace] = 0.0005
	return p
}

// WholeVolumeCrashProbabilities are DefaultProbabilities with crashes of
// every downstairs at once, which the volume survives by restart
// reconciliation (volume/upstairs restart_reconcile.go).
func WholeVolumeCrashProbabilities() Probabilities {
	p := DefaultProbabilities()
	p[faultCrashAll] = 0.001
	return p
}
