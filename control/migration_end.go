package control

import (
	"tern/control/controlapi"
	"tern/instance/apiv1"
)

// SideReport is what one side of a migration last reported: its vmm's
// state, whether its process is gone, and the phase it reached in this
// migration ("" before any; "error" once it failed it).
type SideReport struct {
	// Reported is false until the side reported anything.
	Reported bool
	State    apiv1.State
	Gone     bool
	Phase    string
}

// phaseError and phaseFinish are the migration phases Settle reads.
const (
	phaseError  = "error"
	phaseFinish = "finish"
)

func (s SideReport) running() bool { return s.Reported && !s.Gone && s.State == apiv1.Running }

// dead is a side that will never run: its process is gone, or its vmm
// ended.
func (s SideReport) dead() bool {
	return s.Gone || s.State == apiv1.Destroyed || s.State == apiv1.Failed || s.State == apiv1.Stopped
}

// failing is a side that can no longer complete this migration.
func (s SideReport) failing() bool { return s.dead() || s.Phase == phaseError }

// ActiveSide says which vmm of a migration the instance runs on.
type ActiveSide string

// The sides an instance can be left on.
const (
	ActiveSource ActiveSide = "source"
	ActiveTarget ActiveSide = "target"
	ActiveNone   ActiveSide = "none"
)

// Outcome is what Settle decided: the migration's state, the vmm the
// instance points at, and which vmms to destroy.
type Outcome struct {
	Migration     controlapi.MigrationState
	Active        ActiveSide
	DestroySource bool
	DestroyTarget bool
	// Reason says which rule decided.
	Reason string
}

// Terminal reports whether the outcome ends the migration.
func (o Outcome) Terminal() bool {
	return o.Migration == controlapi.MigrationCompleted || o.Migration == controlapi.MigrationFailed
}

// Settle is the end-of-migration rules, a pure function of the two sides'
// latest reports (docs/ARCHITECTURE.md has them as a table):
//
//  1. The target runs: the migration completed; the instance is on the
//     target and the source is destroyed (a target runs only once it
//     activated the volume at a newer generation, which fences the
//     source, so it is the one to keep).
//  2. The source runs and either side failed the migration (the source
//     reports running again after an error, or the target is dead or
//     erred): the migration failed; the instance stays on the source and
//     the target is destroyed.
//  3. The source is dead and the target can no longer complete it:
//     failed, and the instance has no vmm (both are destroyed). A
//     source that erred but still lives resumes running: wait for it.
//  4. Otherwise it is still in flight: pending until either side
//     reported a migration phase, in progress after; the instance stays
//     on the source.
//
// The instance is never left with two running vmms (1 and 2 destroy the
// other side) nor with none while one runs (3 needs neither running).
// Settle reads only the latest report of each side, and the records keep
// the newest by generation, so reports lost, late or reordered settle
// the same once the last one arrives.
func Settle(src, dst SideReport) Outcome {
	switch {
	case dst.running():
		return Outcome{Migration: controlapi.MigrationCompleted, Active: ActiveTarget, DestroySource: true,
			Reason: "the target runs"}
	case src.running() && (src.Phase == phaseError || dst.failing()):
		return Outcome{Migration: controlapi.MigrationFailed, Active: ActiveSource, DestroyTarget: true,
			Reason: "the source runs and the migration failed"}
	case src.dead() && dst.failing():
		return Outcome{Migration: controlapi.MigrationFailed, Active: ActiveNone, DestroySource: true, DestroyTarget: true,
			Reason: "neither side runs or can complete it"}
	case !dst.Reported && src.Phase == "":
		return Outcome{Migration: controlapi.MigrationPending, Active: ActiveSource, Reason: "not started"}
	default:
		return Outcome{Migration: controlapi.MigrationInProgress, Active: ActiveSource, Reason: "in flight"}
	}
}

// NextOutcome is Settle made sticky: once a migration ended, later
// reports (a completed migration's target failing later, say) are the
// instance's business, not the migration's.
func NextOutcome(prev controlapi.MigrationState, src, dst SideReport) (Outcome, bool) {
	if prev == controlapi.MigrationCompleted || prev == controlapi.MigrationFailed {
		return Outcome{}, false
	}
	return Settle(src, dst), true
}

// InstanceSide is where the instance is left once a settled migration's
// side it kept is itself dead: none. This is the rule for an instance
// outside a migration too (its active vmm died: it has no vmm, failed).
func InstanceSide(o Outcome, src, dst SideReport) ActiveSide {
	switch {
	case o.Active == ActiveSource && src.dead(), o.Active == ActiveTarget && dst.dead():
		return ActiveNone
	}
	return o.Active
}
