package engine

import "fmt"

// ReplicaState is where one downstairs stands in the upstairs' eyes. The
// transitions are drawn here and decided only by nextReplicaState:
//
//	Connecting ──connected──▶ Active ──disconnected──▶ Offline
//	     │                      ▲  │                     │  │
//	     │                      │  └──fault──▶ Faulted ◀─┘  │ backlog overflow
//	     │                      │               │  ▲        │ or fault
//	     │                      └─ repairDone ─ Repairing ◀─┘ (repairStart from Faulted or Offline)
//	     │                      ▲
//	     │                      └──── connected (replay) ──── Offline
//	     └──fault──▶ Faulted
//	any ──stop──▶ Stopped
//
// Active replicas take IO. Offline replicas keep a bounded backlog of jobs
// that is replayed when they reconnect. Faulted replicas get no IO at all
// until something repairs them (Repairing → Active); Stopped is terminal.
type ReplicaState uint8

// Replica states.
const (
	// ReplicaConnecting: not yet part of this activation.
	ReplicaConnecting ReplicaState = iota
	// ReplicaActive: serving IO.
	ReplicaActive
	// ReplicaOffline: the connection was lost; jobs are kept for replay.
	ReplicaOffline
	// ReplicaFaulted: the replica missed jobs or failed one; it needs repair
	// and receives no IO.
	ReplicaFaulted
	// ReplicaRepairing: a repair is bringing the replica back.
	ReplicaRepairing
	// ReplicaStopped: the upstairs was closed or fenced.
	ReplicaStopped
)

var replicaStateNames = [...]string{
	ReplicaConnecting: "connecting",
	ReplicaActive:     "active",
	ReplicaOffline:    "offline",
	ReplicaFaulted:    "faulted",
	ReplicaRepairing:  "repairing",
	ReplicaStopped:    "stopped",
}

// String returns the state's lower-case name.
func (s ReplicaState) String() string {
	if int(s) < len(replicaStateNames) {
		return replicaStateNames[s]
	}
	return fmt.Sprintf("ReplicaState(%d)", uint8(s))
}

// MarshalText writes the name, so logs and JSON say "active", not 1.
func (s ReplicaState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// ReplicaEvent is an input to the replica state machine.
type ReplicaEvent uint8

const (
	// EventConnected: a session was negotiated and activated.
	EventConnected ReplicaEvent = iota
	// EventDisconnected: the connection was lost.
	EventDisconnected
	// EventOverflow: the offline backlog exceeded its bound.
	EventOverflow
	// EventFault: the replica failed a job, returned inconsistent data or
	// missed the activation.
	EventFault
	// EventRepairStart: a repair took the faulted replica over.
	EventRepairStart
	// EventRepairDone: the repair finished; the replica matches its peers.
	EventRepairDone
	// EventStop: the upstairs closed or was fenced.
	EventStop
)

var replicaEventNames = [...]string{
	EventConnected:    "connected",
	EventDisconnected: "disconnected",
	EventOverflow:     "overflow",
	EventFault:        "fault",
	EventRepairStart:  "repairStart",
	EventRepairDone:   "repairDone",
	EventStop:         "stop",
}

func (e ReplicaEvent) String() string {
	if int(e) < len(replicaEventNames) {
		return replicaEventNames[e]
	}
	return fmt.Sprintf("replicaEvent(%d)", uint8(e))
}

// nextReplicaState is the whole replica state machine: the state after ev
// in state cur. An event that does not apply leaves the state unchanged.
func nextReplicaState(cur ReplicaState, ev ReplicaEvent) ReplicaState {
	if ev == EventStop {
		return ReplicaStopped
	}
	switch cur {
	case ReplicaConnecting:
		switch ev {
		case EventConnected:
			return ReplicaActive
		case EventFault, EventOverflow:
			return ReplicaFaulted
		}
	case ReplicaActive:
		switch ev {
		case EventDisconnected:
			return ReplicaOffline
		case EventFault, EventOverflow:
			return ReplicaFaulted
		}
	case ReplicaOffline:
		switch ev {
		case EventConnected:
			return ReplicaActive
		case EventFault, EventOverflow:
			return ReplicaFaulted
		case EventRepairStart:
			// It came back but may have lost writes: repaired, not
			// replayed (Engine.Rejoin).
			return ReplicaRepairing
		}
	case ReplicaFaulted:
		if ev == EventRepairStart {
			return ReplicaRepairing
		}
	case ReplicaRepairing:
		switch ev {
		case EventRepairDone:
			return ReplicaActive
		case EventFault, EventOverflow, EventDisconnected:
			return ReplicaFaulted
		}
	}
	return cur
}

// takesIO reports whether jobs are queued to a replica in state s: Active
// replicas get them sent, Offline ones keep them for replay.
func (s ReplicaState) takesIO() bool { return s == ReplicaActive || s == ReplicaOffline }
