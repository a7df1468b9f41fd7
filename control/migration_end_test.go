package control

import (
	"fmt"
	"testing"

	"tern/control/controlapi"

	"tern/instance/apiv1"
)

var allStates = []apiv1.State{apiv1.Creating, apiv1.Starting, apiv1.Running, apiv1.Rebooting,
	apiv1.Migrating, apiv1.Stopping, apiv1.Stopped, apiv1.Failed, apiv1.Destroyed}

var allPhases = []string{"", "sync", phaseFinish, phaseError}

// allReports is every side report Settle can be given.
func allReports() []SideReport {
	out := []SideReport{{}}
	for _, st := range allStates {
		for _, gone := range []bool{false, true} {
			for _, ph := range allPhases {
				out = append(out, SideReport{Reported: true, State: st, Gone: gone, Phase: ph})
			}
		}
	}
	return out
}

// runningAfter is whether a side still runs once the outcome's destroys
// are applied.
func runningAfter(s SideReport, destroyed bool) bool { return s.running() && !destroyed }

// TestSettleNeverLeavesTwoRunningVMMsOrNoneWhileOneRuns checks every pair
// of reports.
func TestSettleNeverLeavesTwoRunningVMMsOrNoneWhileOneRuns(t *testing.T) {
	for _, src := range allReports() {
		for _, dst := range allReports() {
			o := Settle(src, dst)
			name := fmt.Sprintf("src %+v dst %+v → %+v", src, dst, o)
			srcRuns, dstRuns := runningAfter(src, o.DestroySource), runningAfter(dst, o.DestroyTarget)
			if srcRuns && dstRuns {
				t.Errorf("%s: two running vmms", name)
			}
			if o.Active == ActiveNone && (src.running() || dst.running()) {
				t.Errorf("%s: no active vmm while one runs", name)
			}
			if o.Active == ActiveSource && o.DestroySource || o.Active == ActiveTarget && o.DestroyTarget {
				t.Errorf("%s: destroys the vmm it keeps", name)
			}
			if o.Active == ActiveSource && dst.running() || o.Active == ActiveTarget && src.running() && !o.DestroySource {
				t.Errorf("%s: keeps one side while the other runs", name)
			}
			if !o.Terminal() && (o.DestroySource || o.DestroyTarget) {
				t.Errorf("%s: destroys a vmm of a migration in flight", name)
			}
			if o.Migration == controlapi.MigrationFailed && o.Active == ActiveTarget || o.Migration == controlapi.MigrationCompleted && o.Active != ActiveTarget {
				t.Errorf("%s: active side disagrees with the migration's state", name)
			}
		}
	}
}

// TestSettleRules pins the named rules.
func TestSettleRules(t *testing.T) {
	run := SideReport{Reported: true, State: apiv1.Running}
	for _, tc := range []struct {
		name     string
		src, dst SideReport
		want     Outcome
	}{
		{"a target that runs with the source gone completes it", SideReport{Reported: true, State: apiv1.Migrating, Gone: true},
			SideReport{Reported: true, State: apiv1.Running, Phase: phaseFinish},
			Outcome{Migration: controlapi.MigrationCompleted, Active: ActiveTarget, DestroySource: true}},
		{"a source running again after an error fails it and destroys the target",
			SideReport{Reported: true, State: apiv1.Running, Phase: phaseError}, SideReport{Reported: true, State: apiv1.Migrating},
			Outcome{Migration: controlapi.MigrationFailed, Active: ActiveSource, DestroyTarget: true}},
		{"a dead target fails it", run, SideReport{Reported: true, State: apiv1.Migrating, Gone: true},
			Outcome{Migration: controlapi.MigrationFailed, Active: ActiveSource, DestroyTarget: true}},
		{"both dead leave no vmm", SideReport{Reported: true, State: apiv1.Migrating, Gone: true}, SideReport{Reported: true, State: apiv1.Failed},
			Outcome{Migration: controlapi.MigrationFailed, Active: ActiveNone, DestroySource: true, DestroyTarget: true}},
		{"an erred source that has not resumed yet is waited for", SideReport{Reported: true, State: apiv1.Migrating, Phase: phaseError},
			SideReport{Reported: true, State: apiv1.Failed}, Outcome{Migration: controlapi.MigrationInProgress, Active: ActiveSource}},
		{"nothing from the target yet is pending", run, SideReport{}, Outcome{Migration: controlapi.MigrationPending, Active: ActiveSource}},
	} {
		got := Settle(tc.src, tc.dst)
		got.Reason = ""
		if got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// lifecycle is one side's reports in the order its vmm made them.
type lifecycle []SideReport

func rep(st apiv1.State, phase string) SideReport {
	return SideReport{Reported: true, State: st, Phase: phase}
}

func gone(st apiv1.State, phase string) SideReport {
	return SideReport{Reported: true, State: st, Phase: phase, Gone: true}
}

// scenarios are realistic pairs of lifecycles.
var scenarios = map[string][2]lifecycle{
	"success": {{rep(apiv1.Running, ""), rep(apiv1.Migrating, "sync"), rep(apiv1.Migrating, phaseFinish), rep(apiv1.Destroyed, phaseFinish)},
		{rep(apiv1.Migrating, "sync"), rep(apiv1.Running, phaseFinish)}},
	"success, source process exits": {{rep(apiv1.Running, ""), rep(apiv1.Migrating, "sync"), gone(apiv1.Migrating, "sync")},
		{rep(apiv1.Migrating, "sync"), rep(apiv1.Running, phaseFinish)}},
	"source fails it": {{rep(apiv1.Running, ""), rep(apiv1.Migrating, "sync"), rep(apiv1.Running, phaseError)},
		{rep(apiv1.Migrating, "sync"), rep(apiv1.Failed, phaseError)}},
	"target dies": {{rep(apiv1.Running, ""), rep(apiv1.Migrating, "sync"), rep(apiv1.Running, phaseError)},
		{rep(apiv1.Migrating, "sync"), gone(apiv1.Migrating, "sync")}},
	"source dies mid-copy": {{rep(apiv1.Running, ""), rep(apiv1.Migrating, "sync"), gone(apiv1.Migrating, "sync")},
		{rep(apiv1.Migrating, "sync"), rep(apiv1.Failed, phaseError)}},
	"target never starts": {{rep(apiv1.Running, "")}, {gone(apiv1.Creating, "")}},
}

// deliveries returns every delivery order of the two lifecycles'
// reports, interleaved, with each report but the last of its side
// possibly lost or duplicated. Each entry is (side, index).
func deliveries(a, b int) [][][2]int {
	var out [][][2]int
	var rec func(i, j int, acc [][2]int)
	rec = func(i, j int, acc [][2]int) {
		if i == a && j == b {
			out = append(out, append([][2]int(nil), acc...))
			return
		}
		if i < a {
			rec(i+1, j, append(acc, [2]int{0, i}))
			if i < a-1 {
				rec(i+1, j, acc)                                     // lost
				rec(i+1, j, append(acc, [2]int{0, i}, [2]int{0, i})) // twice
			}
		}
		if j < b {
			rec(i, j+1, append(acc, [2]int{1, j}))
			if j < b-1 {
				rec(i, j+1, acc)
			}
		}
	}
	rec(0, 0, nil)
	// Late: the last report of each side delivered before an earlier one.
	out = append(out, [][2]int{{0, a - 1}, {1, b - 1}, {0, 0}, {1, 0}})
	return out
}

// TestReportsLostLateOrDuplicatedSettleTheSame folds every delivery of
// every scenario the way the records apply reports (newest generation
// per side, sticky once terminal) and checks it ends where the last
// reports say, never passing through two running vmms.
func TestReportsLostLateOrDuplicatedSettleTheSame(t *testing.T) {
	for name, sc := range scenarios {
		want := Settle(sc[0][len(sc[0])-1], sc[1][len(sc[1])-1])
		if !want.Terminal() {
			t.Fatalf("%s: the scenario does not end: %+v", name, want)
		}
		for _, order := range deliveries(len(sc[0]), len(sc[1])) {
			var latest [2]SideReport
			gen := [2]int{-1, -1}
			state := controlapi.MigrationPending
			var got Outcome
			for _, d := range order {
				side, i := d[0], d[1]
				if i <= gen[side] {
					continue // stale: the record keeps the newer report
				}
				gen[side], latest[side] = i, sc[side][i]
				if o, changed := NextOutcome(state, latest[0], latest[1]); changed {
					got, state = o, o.Migration
				}
			}
			// The instance's end: the migration's state and the side it
			// is on once a dead kept side counts as none.
			gotSide := InstanceSide(got, latest[0], latest[1])
			wantSide := InstanceSide(want, latest[0], latest[1])
			if got.Migration != want.Migration || gotSide != wantSide {
				t.Errorf("%s delivered %v: ended %s on %s, want %s on %s", name, order, got.Migration, gotSide, want.Migration, wantSide)
			}
			for side, destroyed := range []bool{got.DestroySource, got.DestroyTarget} {
				if destroyed && gotSide == [2]ActiveSide{ActiveSource, ActiveTarget}[side] {
					t.Errorf("%s delivered %v: destroys the side it keeps", name, order)
				}
			}
		}
	}
}
