package reconcile

import (
	"errors"
	"slices"
	"testing"
)

// A restart reconciliation plans at the generation the running upstairs
// holds, which its own flushes stamped: a dirty source's Target takes a
// flush number above every one issued (the upstairs passes its next) and
// every one present, so no replica can already carry it with other
// blocks.
func TestPlanRestartStampsAFlushNumberNeverIssued(t *testing.T) {
	vs := one(map[ReplicaID]Version{0: dirty(4, 7), 1: clean(4, 7), 2: dirty(4, 7)})
	for _, tc := range []struct {
		issued, wantFlush uint64
	}{
		{issued: 12, wantFlush: 12}, // the upstairs issued flushes up to 11
		{issued: 3, wantFlush: 8},   // never below what replicas hold
	} {
		p, err := PlanRestart(4, tc.issued, vs)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Extents) != 1 {
			t.Fatalf("plan %+v; want one extent", p)
		}
		x := p.Extents[0]
		if x.Source != 0 || !slices.Equal(x.Dests, []ReplicaID{1, 2}) || x.Target != clean(4, tc.wantFlush) {
			t.Errorf("issued %d: repair %+v; want source 0, dests 1 and 2, target %v", tc.issued, x, clean(4, tc.wantFlush))
		}
		if p.NextFlush() != tc.wantFlush+1 {
			t.Errorf("issued %d: NextFlush %d; want %d", tc.issued, p.NextFlush(), tc.wantFlush+1)
		}
	}
	if _, err := PlanRestart(3, 1, vs); !errors.Is(err, ErrStaleGeneration) {
		t.Errorf("a generation below the extents': %v; want ErrStaleGeneration", err)
	}
	if _, err := PlanActivation(4, vs); !errors.Is(err, ErrStaleGeneration) {
		t.Errorf("PlanActivation at the extents' generation: %v; want ErrStaleGeneration", err)
	}
}

// A replica that missed writes its peers took (Behind) is never the
// source while one of them is present, even with the greatest version;
// it is when every present replica is behind.
func TestPlanRestartNeverCopiesFromABehindReplica(t *testing.T) {
	vs := one(map[ReplicaID]Version{0: dirty(4, 7), 1: clean(4, 7), 2: clean(4, 6)})
	vs[0].Behind = true
	p, err := PlanRestart(4, 9, vs)
	if err != nil {
		t.Fatal(err)
	}
	if x := p.Extents[0]; x.Source != 1 || !slices.Equal(x.Dests, []ReplicaID{0, 2}) || x.Target != clean(4, 7) {
		t.Errorf("repair %+v; want source 1 (the greatest version not behind), dests 0 and 2", x)
	}
	for i := range vs {
		vs[i].Behind = true
	}
	p, err = PlanRestart(4, 9, vs)
	if err != nil {
		t.Fatal(err)
	}
	if x := p.Extents[0]; x.Source != 0 {
		t.Errorf("all behind: repair %+v; want source 0, the greatest version", x)
	}
}
