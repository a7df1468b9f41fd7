package upstairs

import "testing"

func TestReplicaStateTransitions(t *testing.T) {
	tests := []struct {
		from ReplicaState
		ev   replicaEvent
		want ReplicaState
	}{
		{ReplicaConnecting, evConnected, ReplicaActive},
		{ReplicaConnecting, evDisconnected, ReplicaConnecting},
		{ReplicaConnecting, evFault, ReplicaFaulted},
		{ReplicaActive, evDisconnected, ReplicaOffline},
		{ReplicaActive, evFault, ReplicaFaulted},
		{ReplicaActive, evOverflow, ReplicaFaulted},
		{ReplicaActive, evConnected, ReplicaActive},
		{ReplicaActive, evRepairDone, ReplicaActive},
		{ReplicaOffline, evConnected, ReplicaActive},
		{ReplicaOffline, evOverflow, ReplicaFaulted},
		{ReplicaOffline, evFault, ReplicaFaulted},
		{ReplicaOffline, evDisconnected, ReplicaOffline},
		{ReplicaFaulted, evConnected, ReplicaFaulted},
		{ReplicaFaulted, evDisconnected, ReplicaFaulted},
		{ReplicaFaulted, evRepairDone, ReplicaFaulted},
		{ReplicaFaulted, evRepairStart, ReplicaRepairing},
		{ReplicaRepairing, evRepairDone, ReplicaActive},
		{ReplicaRepairing, evDisconnected, ReplicaFaulted},
		{ReplicaRepairing, evFault, ReplicaFaulted},
		{ReplicaRepairing, evConnected, ReplicaRepairing},
		{ReplicaActive, evStop, ReplicaStopped},
		{ReplicaFaulted, evStop, ReplicaStopped},
		{ReplicaStopped, evConnected, ReplicaStopped},
		{ReplicaStopped, evRepairStart, ReplicaStopped},
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
