package reconcile

import (
	"errors"
	"fmt"
	"slices"
)

// Errors returned by PlanActivation, wrapped with the details; test with
// errors.Is.
var (
	// ErrNoReplicas means no replica reported extent versions.
	ErrNoReplicas = errors.New("no replica reported extent versions")
	// ErrBadReplica means a replica ID is out of range or listed twice.
	ErrBadReplica = errors.New("bad replica id")
	// ErrExtentCountMismatch means replicas reported different numbers of
	// extents, so they do not hold the same region geometry.
	ErrExtentCountMismatch = errors.New("replicas disagree on extent count")
)

// ReplicaVersions is what one replica reported at activation: the version
// of each of its extents, Extents[e] belonging to ExtentID(e).
type ReplicaVersions struct {
	// Replica is the replica that reported.
	Replica ReplicaID
	// Extents holds one version per extent of the region.
	Extents []Version
}

// ExtentRepair is the repair of one extent: copy from Source to each of
// Dests, then leave every present replica at Target.
type ExtentRepair struct {
	// Extent is the extent to repair.
	Extent ExtentID
	// Source is the replica whose copy wins.
	Source ReplicaID
	// Dests are the replicas that receive the source's differing blocks,
	// in increasing order. It is empty when the source is the only
	// present replica and needs repair only because it is dirty.
	Dests []ReplicaID
	// SourceVersion is the source's version as reported.
	SourceVersion Version
	// Target is the version the source and every destination must carry
	// once the repair of this extent is complete; see RepairedVersion.
	Target Version
}

// Plan is the activation repair of a region: every extent that needs
// repair, in increasing extent order, with totals for progress reporting.
type Plan struct {
	// Extents lists the extents to repair, sorted by Extent. It is empty
	// when every present replica holds every extent clean and equal.
	Extents []ExtentRepair
	// Replicas lists the replicas that took part, in increasing order.
	Replicas []ReplicaID
	// ExtentCount is the number of extents each replica holds.
	ExtentCount int
	// Copies is the number of (extent, destination) pairs: the number of
	// extent comparisons the repair performs.
	Copies int
	// MaxGen and MaxFlush are the largest generation and flush number
	// found on any present extent. The new activation's generation must
	// exceed MaxGen and its first flush number must exceed MaxFlush.
	MaxGen, MaxFlush uint64
}

// PlanActivation compares the extent versions the present replicas
// reported and returns the repairs that make them agree. Replicas that did
// not answer are simply left out of replicas; they are not compared and
// will need live repair.
//
// An extent needs repair when any present replica holds it dirty or the
// replicas' versions differ. Its source is the replica with the greatest
// version (see Version.Compare), the lowest ReplicaID among equals. Its
// destinations are every other present replica when the source is dirty
// (a dirty extent's data cannot be trusted to match anyone's, even with
// equal numbers), otherwise the replicas whose version differs from the
// source's.
//
// PlanActivation reports every input problem at once, joined, each
// wrapping ErrNoReplicas, ErrBadReplica or ErrExtentCountMismatch.
func PlanActivation(replicas []ReplicaVersions) (Plan, error) {
	if err := validateReplicaVersions(replicas); err != nil {
		return Plan{}, fmt.Errorf("planning activation repair: %w", err)
	}
	byID := slices.Clone(replicas)
	slices.SortFunc(byID, func(a, b ReplicaVersions) int { return int(a.Replica - b.Replica) })

	plan := Plan{ExtentCount: len(byID[0].Extents)}
	for _, r := range byID {
		plan.Replicas = append(plan.Replicas, r.Replica)
	}
	for e := range plan.ExtentCount {
		repair, ok := planExtent(ExtentID(e), byID, &plan)
		if ok {
			plan.Extents = append(plan.Extents, repair)
			plan.Copies += len(repair.Dests)
		}
	}
	return plan, nil
}

// planExtent decides the repair of extent e across byID (sorted by
// replica), folding the extent's numbers into plan's maxima.
func planExtent(e ExtentID, byID []ReplicaVersions, plan *Plan) (ExtentRepair, bool) {
	src := 0
	needs := false
	for i, r := range byID {
		v := r.Extents[e]
		plan.MaxGen = max(plan.MaxGen, v.Gen)
		plan.MaxFlush = max(plan.MaxFlush, v.Flush)
		if v.Dirty || v != byID[0].Extents[e] {
			needs = true
		}
		// Strictly greater: on a tie the lower replica, seen first, stays.
		if v.Compare(byID[src].Extents[e]) > 0 {
			src = i
		}
	}
	if !needs {
		return ExtentRepair{}, false
	}
	sv := byID[src].Extents[e]
	repair := ExtentRepair{
		Extent:        e,
		Source:        byID[src].Replica,
		SourceVersion: sv,
		Target:        RepairedVersion(sv),
	}
	for i, r := range byID {
		if i != src && (sv.Dirty || r.Extents[e] != sv) {
			repair.Dests = append(repair.Dests, r.Replica)
		}
	}
	return repair, true
}

// RepairedVersion returns the version every replica of an extent must
// carry after the extent is repaired from a source at version source: the
// source's generation and flush number, clean.
//
// Keeping the source's numbers is safe: the version only has to be equal
// on every replica (so the next activation finds nothing to repair) and
// not exceed what later flushes stamp. Every later flush carries the new
// activation's generation, which exceeds every stored one (Plan.MaxGen),
// so it always supersedes this version. Clearing Dirty is correct because
// after the repair every replica holds the same blocks and that state is
// durable. A dirty source must therefore be flushed (stamped with Target)
// before its blocks are read for copying; see the package documentation
// for the full order.
func RepairedVersion(source Version) Version {
	return Version{Gen: source.Gen, Flush: source.Flush}
}

// validateReplicaVersions returns every problem with replicas, joined.
func validateReplicaVersions(replicas []ReplicaVersions) error {
	if len(replicas) == 0 {
		return ErrNoReplicas
	}
	var errs []error
	var seen [ReplicaCount]bool
	for _, r := range replicas {
		switch {
		case !r.Replica.Valid():
			errs = append(errs, fmt.Errorf("%w: %d is not in 0..%d", ErrBadReplica, r.Replica, ReplicaCount-1))
		case seen[r.Replica]:
			errs = append(errs, fmt.Errorf("%w: %d listed twice", ErrBadReplica, r.Replica))
		default:
			seen[r.Replica] = true
		}
		if n, n0 := len(r.Extents), len(replicas[0].Extents); n != n0 {
			errs = append(errs, fmt.Errorf("%w: replica %d has %d extents, replica %d has %d",
				ErrExtentCountMismatch, r.Replica, n, replicas[0].Replica, n0))
		}
	}
	return errors.Join(errs...)
}
