package reconcile

import (
	"errors"
	"fmt"
	"slices"
	"tern/volume/ids"
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
	// ErrStaleGeneration means the activation generation does not exceed
	// a generation already stored on an extent.
	ErrStaleGeneration = errors.New("activation generation is stale")
)

// ReplicaVersions is what one replica reported at activation: the version
// of each of its extents, Extents[e] belonging to ExtentID(e).
type ReplicaVersions struct {
	// Replica is the replica that reported.
	Replica ReplicaID
	// Extents holds one version per extent of the region.
	Extents []Version
	// Behind (PlanRestart only) marks a replica that missed writes its
	// peers took (it was faulted or under repair when the volume went
	// down): it is a source only when every present replica is behind.
	Behind bool
}

// ExtentRepair is the repair of one extent: copy from Source to each of
// Dests, then leave the source and every destination at Target.
type ExtentRepair struct {
	// Extent is the extent to repair.
	Extent ids.ExtentID
	// Source is the replica whose copy wins.
	Source ReplicaID
	// Dests are the replicas that receive the source's differing blocks,
	// in increasing order. It is empty when the source is the only
	// present replica and needs repair only because it is dirty.
	Dests []ReplicaID
	// SourceVersion is the source's version as reported.
	SourceVersion Version
	// Target is the clean version the source and every destination carry
	// once the extent is repaired. For a clean source it is the source's
	// version. For a dirty source it is a fresh version, {activation
	// generation, Plan.MaxFlush}, that no replica can already hold: see
	// the package documentation for why the source's own numbers would
	// be unsafe there.
	Target Version
	// Donors lists, best first, the replicas the driver takes a block
	// from when the source's copy of it is corrupt (torn by a crash): the
	// destinations, greatest version first, the lowest ReplicaID among
	// equals. A block is taken from the first donor whose copy is not
	// corrupt. Only a dirty extent can hold corrupt blocks (the extent
	// layer never stamps one clean), so Donors is empty for a clean
	// source.
	Donors []ReplicaID
}

// SourceNeedsStamp reports whether the source itself must be flushed and
// stamped with Target before its blocks are read: true when it is dirty.
func (r ExtentRepair) SourceNeedsStamp() bool { return r.SourceVersion != r.Target }

// Plan is the activation repair of a region: every extent that needs
// repair, in increasing extent order, with totals for progress reporting.
type Plan struct {
	// Extents lists the extents to repair, sorted by Extent. It is empty
	// when every present replica holds every extent clean and equal.
	Extents []ExtentRepair
	// Replicas lists the replicas that took part, in increasing order.
	Replicas []ReplicaID
	// Gen is the generation of the activation being planned.
	Gen ids.Generation
	// ExtentCount is the number of extents each replica holds.
	ExtentCount int
	// Copies is the number of (extent, destination) pairs: how many
	// block-hash comparisons, each followed by a copy, the repair makes.
	Copies int
	// MaxGen and MaxFlush are the largest generation and flush number
	// found on any present extent (PlanRestart: MaxFlush is the flush
	// number of a dirty source's Target, above them). Gen exceeds MaxGen
	// (PlanRestart: at least MaxGen); the activation's first flush number
	// must exceed MaxFlush (see NextFlush).
	MaxGen   ids.Generation
	MaxFlush uint64
}

// NextFlush returns the first flush number the activated session may use:
// one above every flush number present, and so above every Target.
func (p Plan) NextFlush() uint64 { return p.MaxFlush + 1 }

// PlanActivation compares the extent versions the present replicas
// reported to an activation at generation gen and returns the repairs that
// make them agree. Replicas that did not answer are simply left out of
// replicas; they are not compared and will need live repair.
//
// An extent needs repair when any present replica holds it dirty or the
// replicas' versions differ. Its source is the replica with the greatest
// version (see Version.Compare), the lowest ReplicaID among equals. Its
// destinations are every other present replica when the source is dirty
// (a dirty extent's blocks need not match anyone's, even with equal
// numbers), otherwise the replicas whose version differs from the
// source's.
//
// gen must exceed every generation present (a downstairs only accepts a
// higher generation, so a lower one means the inputs are stale), else
// the error wraps ErrStaleGeneration. Problems with replicas are
// reported all at once, joined, each wrapping ErrNoReplicas,
// ErrBadReplica or ErrExtentCountMismatch.
func PlanActivation(gen ids.Generation, replicas []ReplicaVersions) (Plan, error) {
	if err := validateReplicaVersions(replicas); err != nil {
		return Plan{}, fmt.Errorf("planning activation repair: %w", err)
	}
	plan, byID := newPlan(gen, replicas)
	if gen <= plan.MaxGen {
		return Plan{}, fmt.Errorf("planning activation repair: %w: activation generation %d, extents hold generation %d",
			ErrStaleGeneration, gen, plan.MaxGen)
	}
	return planExtents(plan, byID, Version{Gen: gen, Flush: plan.MaxFlush}), nil
}

// PlanRestart plans the reconciliation of a running volume whose replicas
// all restarted (none is left to live-repair the others from): the
// upstairs reconciles them in place, as at activation, but at the
// generation it already holds, which its own flushes may have stamped on
// extents. So a dirty source's Target cannot borrow the generation's
// novelty: it is {gen, flush}, where flush must exceed every flush number
// the upstairs ever issued at gen (it knows them); it is raised above
// every flush number present if need be, and Plan.NextFlush is then above
// it. Otherwise the plan is PlanActivation's: the same sources,
// destinations, donors and errors, except that gen may equal the greatest
// generation present (ErrStaleGeneration only when it is below), and a
// replica marked Behind is a source only when every present one is.
func PlanRestart(gen ids.Generation, flush uint64, replicas []ReplicaVersions) (Plan, error) {
	if err := validateReplicaVersions(replicas); err != nil {
		return Plan{}, fmt.Errorf("planning restart repair: %w", err)
	}
	plan, byID := newPlan(gen, replicas)
	if gen < plan.MaxGen {
		return Plan{}, fmt.Errorf("planning restart repair: %w: generation %d, extents hold generation %d",
			ErrStaleGeneration, gen, plan.MaxGen)
	}
	fresh := Version{Gen: gen, Flush: max(flush, plan.MaxFlush+1)}
	plan = planExtents(plan, byID, fresh)
	plan.MaxFlush = fresh.Flush
	return plan, nil
}

// newPlan starts the plan of replicas (validated) at generation gen: the
// replicas sorted by ID, and the greatest generation and flush present.
func newPlan(gen ids.Generation, replicas []ReplicaVersions) (Plan, []ReplicaVersions) {
	byID := slices.Clone(replicas)
	slices.SortFunc(byID, func(a, b ReplicaVersions) int { return int(a.Replica - b.Replica) })
	plan := Plan{Gen: gen, ExtentCount: len(byID[0].Extents)}
	for _, r := range byID {
		plan.Replicas = append(plan.Replicas, r.Replica)
		for _, v := range r.Extents {
			plan.MaxGen = max(plan.MaxGen, v.Gen)
			plan.MaxFlush = max(plan.MaxFlush, v.Flush)
		}
	}
	return plan, byID
}

// planExtents adds to plan the repair of every extent that needs one;
// fresh is the Target of a dirty source.
func planExtents(plan Plan, byID []ReplicaVersions, fresh Version) Plan {
	for e := range plan.ExtentCount {
		if repair, ok := planExtent(ids.ExtentID(e), byID, fresh); ok {
			plan.Extents = append(plan.Extents, repair)
			plan.Copies += len(repair.Dests)
		}
	}
	return plan
}

// planExtent decides the repair of extent e across byID (sorted by
// replica); fresh is the Target for a dirty source.
func planExtent(e ids.ExtentID, byID []ReplicaVersions, fresh Version) (ExtentRepair, bool) {
	src := -1
	needs := false
	allBehind := !slices.ContainsFunc(byID, func(r ReplicaVersions) bool { return !r.Behind })
	for i, r := range byID {
		v := r.Extents[e]
		if v.Dirty || v != byID[0].Extents[e] {
			needs = true
		}
		if r.Behind && !allBehind {
			continue
		}
		// Strictly greater: on a tie the lower replica, seen first, stays.
		if src < 0 || v.Compare(byID[src].Extents[e]) > 0 {
			src = i
		}
	}
	if !needs {
		return ExtentRepair{}, false
	}
	sv := byID[src].Extents[e]
	repair := ExtentRepair{Extent: e, Source: byID[src].Replica, SourceVersion: sv, Target: sv}
	if sv.Dirty {
		repair.Target = fresh
	}
	for i, r := range byID {
		if i != src && (sv.Dirty || r.Extents[e] != sv) {
			repair.Dests = append(repair.Dests, r.Replica)
		}
	}
	if sv.Dirty && len(repair.Dests) > 0 {
		// Dests are every other replica here, in ReplicaID order, so a
		// stable sort keeps the lowest ID first among equal versions.
		repair.Donors = slices.Clone(repair.Dests)
		version := func(id ReplicaID) Version {
			i := slices.IndexFunc(byID, func(r ReplicaVersions) bool { return r.Replica == id })
			return byID[i].Extents[e]
		}
		slices.SortStableFunc(repair.Donors, func(a, b ReplicaID) int { return version(b).Compare(version(a)) })
	}
	return repair, true
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
