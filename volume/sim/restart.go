package sim

import (
	"fmt"

	"tern/volume/reconcile"
	"tern/volume/upstairs/engine"
)

// Restart reconciliation, after restart_reconcile.go: when every replica
// restarted (a crash of the whole volume, faultCrashAll) each comes back
// saying it may have lost writes and none is Active to live-repair it
// from, so the engine holds its session (Engine.Rejoin says RejoinHold).
// Once all three are held the upstairs reads their extent versions,
// plans with reconcile.PlanRestart at its own generation, repairs the
// plan as a takeover does (repairPlan's steps), and calls Engine.Restarted,
// which replays every live job to each; a flush follows. If a replica
// becomes Active first (replayed), the held ones are live-repaired from
// it instead. The real driver also goes ahead with two held replicas
// after Config.ActivationQuorumWait; here a crashed downstairs always
// restarts, so the run waits for the third.

// hold holds r's session for a restart reconciliation.
func (u *upNode) hold(r int) {
	u.w.s.note("u%d: d%d may have lost writes and none is active: held for a restart reconciliation", u.n, r)
	u.held[r] = true
	u.considerRestart()
}

// releaseHeld hands the held replicas to live repair once one is Active.
func (u *upNode) releaseHeld() {
	if u.restarting || !u.eng.AnyActive() {
		return
	}
	for r := range u.held {
		if !u.held[r] {
			continue
		}
		u.held[r] = false
		u.w.s.note("u%d: d%d released from hold: live repair", u.n, r)
		u.eng.RepairStarted(r)
		u.startRepair(r)
	}
	u.apply()
}

// considerRestart starts the restart reconciliation once every replica's
// session is held.
func (u *upNode) considerRestart() {
	if u.restarting || u.eng.AnyActive() {
		return
	}
	for r := range u.held {
		if !u.held[r] || !u.conns[r].activated {
			return
		}
	}
	u.restarting = true
	flush := u.eng.NextFlush()
	n := int(u.w.spec.ExtentCount)
	versions := make([]reconcile.ReplicaVersions, engine.ReplicaCount)
	left := engine.ReplicaCount * n
	failed := false
	for r := range versions {
		// restart_reconcile.go: a replica held Faulted or Repairing
		// missed jobs its peers took.
		behind := u.eng.Behind(r)
		versions[r] = reconcile.ReplicaVersions{Replica: reconcile.ReplicaID(r), Extents: make([]reconcile.Version, n), Behind: behind}
		for e := range n {
			u.callOn(r, &message{kind: mExtentHashes, extent: uint32(e)}, func(m *message) {
				left--
				if m == nil || m.kind != mHashesReply {
					failed = true
				} else {
					versions[r].Extents[e] = versionOf(m)
				}
				if left > 0 {
					return
				}
				if failed {
					u.restartFailed("collecting extent versions failed")
					return
				}
				plan, err := reconcile.PlanRestart(u.gen, flush, versions)
				if err != nil {
					u.restartFailed(err.Error())
					return
				}
				u.w.s.note("u%d restart plan: %d extent repairs", u.n, len(plan.Extents))
				u.planVersions = versions
				u.repairPlanThen(plan, 0, func() { u.restarted(plan) })
			})
		}
	}
}

// restartFailed gives a restart reconciliation attempt up (a bit flipped
// again in a block it had just mended, say) and, like runRestart, plans
// again a while later.
func (u *upNode) restartFailed(why string) {
	u.restarting = false
	u.w.s.note("u%d restart reconciliation failed: %s; planning again", u.n, why)
	u.w.s.after(100, fmt.Sprintf("u%d restart again", u.n), u.considerRestart)
}

// restarted ends a successful restart reconciliation.
func (u *upNode) restarted(plan reconcile.Plan) {
	u.restarting = false
	var part [engine.ReplicaCount]bool
	for r := range part {
		part[r] = u.held[r]
		u.held[r] = false
	}
	if u.eng.AnyActive() {
		u.w.violate("a replica became active during the restart reconciliation")
		return
	}
	u.eng.Restarted(part, plan.NextFlush())
	u.w.s.note("u%d restart reconciliation done: %v", u.n, part)
	u.apply()
	u.w.s.after(0, fmt.Sprintf("u%d flush after restart", u.n), u.flushAfterRepair)
}
