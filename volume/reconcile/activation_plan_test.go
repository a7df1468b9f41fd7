package reconcile

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"

	"tern/volume/ids"
)

// clean and dirty build versions tersely for tables.
func clean(gen ids.Generation, flush uint64) Version { return Version{Gen: gen, Flush: flush} }
func dirty(gen ids.Generation, flush uint64) Version {
	return Version{Gen: gen, Flush: flush, Dirty: true}
}

// one builds the input for a single-extent region from per-replica
// versions; replicas mapped to nothing are absent.
func one(vs map[ReplicaID]Version) []ReplicaVersions {
	var out []ReplicaVersions
	for r := range ReplicaID(ReplicaCount) {
		if v, ok := vs[r]; ok {
			out = append(out, ReplicaVersions{Replica: r, Extents: []Version{v}})
		}
	}
	return out
}

func TestPlanActivationSingleExtentShapes(t *testing.T) {
	const gen = 10
	// fresh is the Target of a dirty source: {activation gen, MaxFlush}.
	fresh := func(maxFlush uint64) Version { return clean(gen, maxFlush) }
	tests := []struct {
		name     string
		versions map[ReplicaID]Version
		want     *ExtentRepair // nil: nothing to repair
	}{
		{
			name:     "all equal and clean needs nothing",
			versions: map[ReplicaID]Version{0: clean(1, 5), 1: clean(1, 5), 2: clean(1, 5)},
		},
		{
			name:     "one dirty replica is the source and all others are dests",
			versions: map[ReplicaID]Version{0: clean(1, 5), 1: dirty(1, 5), 2: clean(1, 5)},
			want:     &ExtentRepair{Source: 1, Dests: []ReplicaID{0, 2}, SourceVersion: dirty(1, 5), Target: fresh(5), Donors: []ReplicaID{0, 2}},
		},
		{
			name:     "higher flush wins and only differing replicas are dests",
			versions: map[ReplicaID]Version{0: clean(1, 5), 1: clean(1, 6), 2: clean(1, 5)},
			want:     &ExtentRepair{Source: 1, Dests: []ReplicaID{0, 2}, SourceVersion: clean(1, 6), Target: clean(1, 6)},
		},
		{
			name:     "generation dominates flush",
			versions: map[ReplicaID]Version{0: clean(1, 9), 1: clean(1, 9), 2: clean(2, 1)},
			want:     &ExtentRepair{Source: 2, Dests: []ReplicaID{0, 1}, SourceVersion: clean(2, 1), Target: clean(2, 1)},
		},
		{
			name:     "generation dominates dirty",
			versions: map[ReplicaID]Version{0: dirty(1, 9), 1: clean(2, 1), 2: clean(2, 1)},
			want:     &ExtentRepair{Source: 1, Dests: []ReplicaID{0}, SourceVersion: clean(2, 1), Target: clean(2, 1)},
		},
		{
			name:     "all three differ",
			versions: map[ReplicaID]Version{0: clean(1, 3), 1: clean(1, 4), 2: clean(1, 2)},
			want:     &ExtentRepair{Source: 1, Dests: []ReplicaID{0, 2}, SourceVersion: clean(1, 4), Target: clean(1, 4)},
		},
		{
			name:     "clean source leaves an equal replica alone",
			versions: map[ReplicaID]Version{0: clean(1, 4), 1: clean(1, 3), 2: clean(1, 4)},
			want:     &ExtentRepair{Source: 0, Dests: []ReplicaID{1}, SourceVersion: clean(1, 4), Target: clean(1, 4)},
		},
		{
			name:     "tie between clean maxima goes to the lowest replica",
			versions: map[ReplicaID]Version{0: clean(1, 4), 1: clean(1, 5), 2: clean(1, 5)},
			want:     &ExtentRepair{Source: 1, Dests: []ReplicaID{0}, SourceVersion: clean(1, 5), Target: clean(1, 5)},
		},
		{
			name:     "tie between dirty maxima goes to the lowest replica and all others are dests",
			versions: map[ReplicaID]Version{0: clean(1, 5), 1: dirty(1, 5), 2: dirty(1, 5)},
			want:     &ExtentRepair{Source: 1, Dests: []ReplicaID{0, 2}, SourceVersion: dirty(1, 5), Target: fresh(5), Donors: []ReplicaID{2, 0}},
		},
		{
			name:     "all dirty and equal still repairs",
			versions: map[ReplicaID]Version{0: dirty(3, 7), 1: dirty(3, 7), 2: dirty(3, 7)},
			want:     &ExtentRepair{Source: 0, Dests: []ReplicaID{1, 2}, SourceVersion: dirty(3, 7), Target: fresh(7), Donors: []ReplicaID{1, 2}},
		},
		{
			name:     "donors of a dirty source are ranked by version, not by replica",
			versions: map[ReplicaID]Version{0: clean(1, 3), 1: dirty(2, 1), 2: clean(1, 4)},
			want:     &ExtentRepair{Source: 1, Dests: []ReplicaID{0, 2}, SourceVersion: dirty(2, 1), Target: fresh(4), Donors: []ReplicaID{2, 0}},
		},
		{
			name:     "one replica missing compares the other two",
			versions: map[ReplicaID]Version{0: clean(1, 2), 2: clean(1, 3)},
			want:     &ExtentRepair{Source: 2, Dests: []ReplicaID{0}, SourceVersion: clean(1, 3), Target: clean(1, 3)},
		},
		{
			name:     "one replica missing and the others equal needs nothing",
			versions: map[ReplicaID]Version{1: clean(1, 2), 2: clean(1, 2)},
		},
		{
			name:     "lone dirty replica is stamped with no dests",
			versions: map[ReplicaID]Version{2: dirty(4, 4)},
			want:     &ExtentRepair{Source: 2, SourceVersion: dirty(4, 4), Target: fresh(4)},
		},
		{
			name:     "lone clean replica needs nothing",
			versions: map[ReplicaID]Version{1: clean(4, 4)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := PlanActivation(gen, one(tt.versions))
			if err != nil {
				t.Fatalf("PlanActivation: %v", err)
			}
			if tt.want == nil {
				if len(plan.Extents) != 0 || plan.Copies != 0 {
					t.Fatalf("plan = %+v; want nothing to repair", plan)
				}
				return
			}
			if len(plan.Extents) != 1 {
				t.Fatalf("plan.Extents = %+v; want one repair", plan.Extents)
			}
			if got := plan.Extents[0]; !reflect.DeepEqual(got, *tt.want) {
				t.Errorf("repair = %+v\n want %+v", got, *tt.want)
			}
			if plan.Copies != len(tt.want.Dests) {
				t.Errorf("Copies = %d; want %d", plan.Copies, len(tt.want.Dests))
			}
			if got, want := plan.Extents[0].SourceNeedsStamp(), tt.want.SourceVersion.Dirty; got != want {
				t.Errorf("SourceNeedsStamp = %v; want %v", got, want)
			}
		})
	}
}

func TestPlanActivationListsExtentsInOrderWithTotals(t *testing.T) {
	replicas := []ReplicaVersions{
		// Given out of replica order on purpose.
		{Replica: 2, Extents: []Version{clean(1, 1), clean(1, 2), clean(2, 7), dirty(1, 1)}},
		{Replica: 0, Extents: []Version{clean(1, 1), clean(1, 1), clean(2, 7), clean(1, 1)}},
		{Replica: 1, Extents: []Version{clean(1, 1), clean(1, 1), clean(2, 7), clean(1, 1)}},
	}
	plan, err := PlanActivation(3, replicas)
	if err != nil {
		t.Fatal(err)
	}
	want := Plan{
		Extents: []ExtentRepair{
			{Extent: 1, Source: 2, Dests: []ReplicaID{0, 1}, SourceVersion: clean(1, 2), Target: clean(1, 2)},
			{Extent: 3, Source: 2, Dests: []ReplicaID{0, 1}, SourceVersion: dirty(1, 1), Target: clean(3, 7), Donors: []ReplicaID{0, 1}},
		},
		Replicas:    []ReplicaID{0, 1, 2},
		Gen:         3,
		ExtentCount: 4,
		Copies:      4,
		MaxGen:      2,
		MaxFlush:    7,
	}
	if !reflect.DeepEqual(plan, want) {
		t.Errorf("plan = %+v\n want %+v", plan, want)
	}
	if plan.NextFlush() != 8 {
		t.Errorf("NextFlush = %d; want 8", plan.NextFlush())
	}
}

func TestPlanActivationRejectsBadInput(t *testing.T) {
	ext := func(n int) []Version { return make([]Version, n) }
	tests := []struct {
		name     string
		gen      ids.Generation
		replicas []ReplicaVersions
		want     []error
	}{
		{"no replicas", 1, nil, []error{ErrNoReplicas}},
		{"negative replica", 1, []ReplicaVersions{{Replica: -1, Extents: ext(1)}}, []error{ErrBadReplica}},
		{"replica out of range", 1, []ReplicaVersions{{Replica: 3, Extents: ext(1)}}, []error{ErrBadReplica}},
		{"duplicate replica", 1, []ReplicaVersions{{Replica: 1, Extents: ext(1)}, {Replica: 1, Extents: ext(1)}}, []error{ErrBadReplica}},
		{"extent counts differ", 1, []ReplicaVersions{{Replica: 0, Extents: ext(2)}, {Replica: 1, Extents: ext(3)}}, []error{ErrExtentCountMismatch}},
		{
			"every problem reported at once", 1,
			[]ReplicaVersions{{Replica: 0, Extents: ext(2)}, {Replica: 7, Extents: ext(3)}},
			[]error{ErrBadReplica, ErrExtentCountMismatch},
		},
		{"generation equal to a stored one", 4, []ReplicaVersions{{Replica: 0, Extents: []Version{clean(4, 1)}}}, []error{ErrStaleGeneration}},
		{"generation below a stored one", 2, []ReplicaVersions{{Replica: 0, Extents: []Version{clean(4, 1)}}}, []error{ErrStaleGeneration}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := PlanActivation(tt.gen, tt.replicas)
			if err == nil {
				t.Fatal("PlanActivation succeeded")
			}
			for _, w := range tt.want {
				if !errors.Is(err, w) {
					t.Errorf("error %q does not wrap %v", err, w)
				}
			}
		})
	}
}

func TestVersionCompareOrdersGenThenFlushThenDirty(t *testing.T) {
	ordered := []Version{clean(0, 0), dirty(0, 0), clean(0, 1), dirty(0, 1), clean(1, 0), dirty(1, 0), clean(1, 9)}
	for i, a := range ordered {
		for j, b := range ordered {
			want := 0
			if i < j {
				want = -1
			} else if i > j {
				want = 1
			}
			if got := a.Compare(b); got != want {
				t.Errorf("%v.Compare(%v) = %d; want %d", a, b, got, want)
			}
		}
	}
}

// replicaModel is one replica's copy of one extent in the crash model:
// its version and an identifier of its blocks' contents.
type replicaModel struct {
	v    Version
	data int
}

// TestRepairNeverMakesUnequalCopiesLookEqual runs seeded random regions
// through the documented repair order, crashing at a random step and
// activating again, and checks the rule every replica relies on: two
// clean copies with equal versions hold equal data — also on the replica
// absent from the activation, and at every crash point. It then checks
// that the next full repair converges.
func TestRepairNeverMakesUnequalCopiesLookEqual(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for iter := range 3000 {
		state := randomConsistentExtent(rng)
		absent := ReplicaID(rng.IntN(ReplicaCount + 1)) // ReplicaCount: none absent
		gen := ids.Generation(10)
		crashAt := rng.IntN(6)
		for round := 0; round < 2; round++ {
			steps := repairSteps(t, gen, state, absent)
			if round == 0 && crashAt < len(steps) {
				steps = steps[:crashAt]
			}
			for _, step := range steps {
				step()
				checkCleanEqualMeansSame(t, iter, state)
			}
			gen++
		}
		for r := range ReplicaID(ReplicaCount) {
			if r == absent {
				continue
			}
			if state[r].v.Dirty || state[r] != state[firstPresent(absent)] {
				t.Fatalf("iter %d: not converged after a full repair: %+v (absent %d)", iter, state, absent)
			}
		}
	}
}

// randomConsistentExtent returns three copies of an extent with small
// random versions and contents, made to obey the clean-equal rule.
func randomConsistentExtent(rng *rand.Rand) *[ReplicaCount]replicaModel {
	var s [ReplicaCount]replicaModel
	for r := range s {
		s[r] = replicaModel{
			v:    Version{Gen: ids.Generation(1 + rng.IntN(2)), Flush: uint64(rng.IntN(3)), Dirty: rng.IntN(2) == 0},
			data: rng.IntN(3),
		}
		for q := range r {
			if !s[r].v.Dirty && s[r].v == s[q].v {
				s[r].data = s[q].data
			}
		}
	}
	return &s
}

// repairSteps plans the extent over the present replicas and returns the
// driver's steps in the documented order, each mutating state.
func repairSteps(t *testing.T, gen ids.Generation, state *[ReplicaCount]replicaModel, absent ReplicaID) []func() {
	var in []ReplicaVersions
	for r := range ReplicaID(ReplicaCount) {
		if r != absent {
			in = append(in, ReplicaVersions{Replica: r, Extents: []Version{state[r].v}})
		}
	}
	plan, err := PlanActivation(gen, in)
	if err != nil {
		t.Fatal(err)
	}
	var steps []func()
	for _, rep := range plan.Extents {
		src := rep.Source
		if rep.SourceNeedsStamp() {
			steps = append(steps, func() { state[src].v = rep.Target })
		}
		for _, d := range rep.Dests {
			steps = append(steps,
				func() { // copy: a write makes the extent dirty first
					if state[d].data != state[src].data {
						state[d].v.Dirty = true
						state[d].data = state[src].data
					}
				},
				func() { state[d].v = rep.Target },
			)
		}
	}
	return steps
}

func checkCleanEqualMeansSame(t *testing.T, iter int, s *[ReplicaCount]replicaModel) {
	t.Helper()
	for a := range s {
		for b := range a {
			if !s[a].v.Dirty && s[a].v == s[b].v && s[a].data != s[b].data {
				t.Fatalf("iter %d: replicas %d and %d are clean at %v with different data: %+v", iter, b, a, s[a].v, *s)
			}
		}
	}
}

func firstPresent(absent ReplicaID) ReplicaID {
	if absent == 0 {
		return 1
	}
	return 0
}
