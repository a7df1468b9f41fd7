package engine

import "testing"

func TestReplicaStateTransitions(t *testing.T) {
	tests := []struct {
		from ReplicaState
		ev   ReplicaEvent
		want ReplicaState
	}{
		{ReplicaConnecting, EventConnected, ReplicaActive},
		{ReplicaConnecting, EventDisconnected, ReplicaConnecting},
		{ReplicaConnecting, EventFault, ReplicaFaulted},
		{ReplicaActive, EventDisconnected, ReplicaOffline},
		{ReplicaActive, EventFault, ReplicaFaulted},
		{ReplicaActive, EventOverflow, ReplicaFaulted},
		{ReplicaActive, EventConnected, ReplicaActive},
		{ReplicaActive, EventRepairDone, ReplicaActive},
		{ReplicaOffline, EventConnected, ReplicaActive},
		{ReplicaOffline, EventOverflow, ReplicaFaulted},
		{ReplicaOffline, EventFault, ReplicaFaulted},
		{ReplicaOffline, EventDisconnected, ReplicaOffline},
		{ReplicaFaulted, EventConnected, ReplicaFaulted},
		{ReplicaFaulted, EventDisconnected, ReplicaFaulted},
		{ReplicaFaulted, EventRepairDone, ReplicaFaulted},
		{ReplicaFaulted, EventRepairStart, ReplicaRepairing},
		{ReplicaRepairing, EventRepairDone, ReplicaActive},
		{ReplicaRepairing, EventDisconnected, ReplicaFaulted},
		{ReplicaRepairing, EventFault, ReplicaFaulted},
		{ReplicaRepairing, EventConnected, ReplicaRepairing},
		{ReplicaActive, EventStop, ReplicaStopped},
		{ReplicaFaulted, EventStop, ReplicaStopped},
		{ReplicaStopped, EventConnected, ReplicaStopped},
		{ReplicaStopped, EventRepairStart, ReplicaStopped},
	}
	for _, tt := range tests {
		if got := nextReplicaState(tt.from, tt.ev); got != tt.want {
			t.Errorf("%v + %v = %v, want %v", tt.from, tt.ev, got, tt.want)
		}
	}
}

// TestOnlyActiveAndOfflineTakeIO pins which states get jobs queued: a
// faulted or repairing replica gets nothing until repaired.
func TestOnlyActiveAndOfflineTakeIO(t *testing.T) {
	for s := ReplicaConnecting; s <= ReplicaStopped; s++ {
		want := s == ReplicaActive || s == ReplicaOffline
		if s.takesIO() != want {
			t.Errorf("%v.takesIO() = %v, want %v", s, s.takesIO(), want)
		}
	}
}
