package reconcile

import (
	"time"
)

// DefaultQuorumWait is how long activation waits for the third replica
// once two have answered, before going ahead without it.
const DefaultQuorumWait = 5 * time.Second

// QuorumVerdict is the outcome of DecideQuorum.
type QuorumVerdict struct {
	// Proceed reports that activation may go ahead with the replicas that
	// answered: all three, or two after the wait.
	Proceed bool
	// Missing lists, in increasing order, the replicas that have not
	// answered. When Proceed is true they are left out of the activation
	// plan and must be brought back by live repair once they connect.
	Missing []ReplicaID
	// RecheckAt, when not zero, is the moment the verdict turns to Proceed
	// if nothing else changes: the driver arms a timer for it. It is zero
	// when Proceed is true or when only another answer can change the
	// verdict.
	RecheckAt time.Time
}

// DecideQuorum decides whether a read-write activation may proceed, given
// when each replica answered negotiation (answeredAt[r], the zero time for
// a replica that has not answered or has since gone away) and the current
// time now.
//
//   - All three answered: proceed at once.
//   - Exactly two answered: proceed once wait has passed since the second
//     answer, so a slightly slower third still joins the activation; until
//     then RecheckAt says when to ask again. A wait of zero or less
//     proceeds as soon as two have answered.
//   - Fewer than two: never proceed; a lone replica may hold no copy of
//     data that a two-replica flush acknowledged.
//
// Two replicas suffice because every flush the guest saw acknowledged
// reached two of the three replicas, and any two of three share at least
// one: the plan over the two present replicas therefore picks a source
// that holds every acknowledged flush.
func DecideQuorum(answeredAt [ReplicaCount]time.Time, now time.Time, wait time.Duration) QuorumVerdict {
	var v QuorumVerdict
	var answered []time.Time
	for r, at := range answeredAt {
		if at.IsZero() {
			v.Missing = append(v.Missing, ReplicaID(r))
		} else {
			answered = append(answered, at)
		}
	}
	switch len(answered) {
	case ReplicaCount:
		v.Proceed = true
	case ReplicaCount - 1:
		quorumAt := answered[0]
		if answered[1].After(quorumAt) {
			quorumAt = answered[1]
		}
		deadline := quorumAt.Add(max(wait, 0))
		if !now.Before(deadline) {
			v.Proceed = true
		} else {
			v.RecheckAt = deadline
		}
	}
	return v
}
