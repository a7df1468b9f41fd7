package engine

import (
	"testing"

	"tern/volume/ids"
	"tern/volume/internal/fixes"
	"tern/volume/wire"
)

// TestSessionActivatedDecidesAndActs covers the rejoin decisions the
// upstairs and the simulator both take from SessionActivated, and each
// past fix in them undone.
func TestSessionActivatedDecidesAndActs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		setup     func(h *harness) // from three Active replicas
		lost      bool
		undo      fixes.Fix
		undone    bool
		want      RejoinDecision
		wantState ReplicaState
	}{
		{name: "intact offline replica is replayed", setup: func(h *harness) { h.e.Disconnected(2) },
			want: RejoinReplay, wantState: ReplicaActive},
		{name: "offline replica that may have lost writes is repaired", setup: func(h *harness) { h.e.Disconnected(2) },
			lost: true, want: RejoinRepair, wantState: ReplicaRepairing},
		{name: "lost writes fix undone: replayed", setup: func(h *harness) { h.e.Disconnected(2) },
			lost: true, undo: fixes.RepairLostWrites, undone: true, want: RejoinReplay, wantState: ReplicaActive},
		{name: "no active peer: held", setup: func(h *harness) {
			for r := range ReplicaCount {
				h.e.Disconnected(r)
			}
		}, lost: true, want: RejoinHold, wantState: ReplicaOffline},
		{name: "hold fix undone: repaired with no source", setup: func(h *harness) {
			for r := range ReplicaCount {
				h.e.Disconnected(r)
			}
		}, lost: true, undo: fixes.HoldWithoutSource, undone: true, want: RejoinRepair, wantState: ReplicaRepairing},
		{name: "repairing replica keeps repairing", setup: func(h *harness) { h.e.Fault(2); h.e.RepairStarted(2) },
			want: RejoinRepair, wantState: ReplicaRepairing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.undone {
				defer fixes.Undo(tc.undo)()
			}
			h := newHarness(t, Limits{})
			tc.setup(h)
			h.drain()
			versions := []wire.ExtentVersion{{Gen: 1, Flush: 0}}
			if got := h.e.SessionActivated(2, ids.Generation(1), versions, tc.lost); got != tc.want {
				t.Errorf("SessionActivated = %v; want %v", got, tc.want)
			}
			if st := h.e.State(2); st != tc.wantState {
				t.Errorf("replica 2 is %v; want %v", st, tc.wantState)
			}
		})
	}
}

func TestFlushedAtIsTheGreatestFlushOfTheGeneration(t *testing.T) {
	vs := []wire.ExtentVersion{{Gen: 1, Flush: 9}, {Gen: 2, Flush: 4}, {Gen: 2, Flush: 6, Dirty: true}, {Gen: 3, Flush: 1}}
	if got := FlushedAt(vs, 2); got != 6 {
		t.Errorf("FlushedAt(gen 2) = %d; want 6", got)
	}
	if got := FlushedAt(vs, 5); got != 0 {
		t.Errorf("FlushedAt(gen 5) = %d; want 0", got)
	}
}

func TestLiveRepairSourcePassesOverTheBadOne(t *testing.T) {
	h := newHarness(t, Limits{})
	h.e.Fault(1)
	h.drain()
	for _, tc := range []struct {
		r, avoid int
		undo     bool
		want     int
	}{
		{r: 1, avoid: -1, want: 0},
		{r: 1, avoid: 0, want: 2},
		{r: 1, avoid: 2, want: 0},
		{r: 1, avoid: 0, undo: true, want: 0},
	} {
		var restore func()
		if tc.undo {
			restore = fixes.Undo(fixes.AvoidBadLiveSource)
		}
		got := h.e.LiveRepairSource(tc.r, tc.avoid)
		if restore != nil {
			restore()
		}
		if got != tc.want {
			t.Errorf("LiveRepairSource(%d, avoid %d, undone %v) = %d; want %d", tc.r, tc.avoid, tc.undo, got, tc.want)
		}
	}
	h.e.Disconnected(0)
	h.e.Disconnected(2)
	h.drain()
	if got := h.e.LiveRepairSource(1, -1); got != -1 {
		t.Errorf("with no Active replica, LiveRepairSource = %d; want -1", got)
	}
}
