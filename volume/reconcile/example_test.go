package reconcile_test

import (
	"fmt"
	"time"

	"tern/volume/ids"
	"tern/volume/reconcile"
)

// The activation driver: plan over the replicas that answered, then for
// each extent stamp a dirty source, diff block hashes and copy only the
// differing runs, reporting progress as it goes.
func ExamplePlanActivation() {
	const blockSize = 4096
	v := func(gen ids.Generation, flush uint64, dirty bool) reconcile.Version {
		return reconcile.Version{Gen: gen, Flush: flush, Dirty: dirty}
	}
	// Replica 1 did not answer within the quorum wait.
	plan, err := reconcile.PlanActivation(5, []reconcile.ReplicaVersions{
		{Replica: 0, Extents: []reconcile.Version{v(4, 9, false), v(4, 9, true)}},
		{Replica: 2, Extents: []reconcile.Version{v(4, 9, false), v(4, 8, false)}},
	})
	if err != nil {
		panic(err)
	}
	tracker := reconcile.NewTracker(nil)
	tracker.SetPhase(reconcile.PhaseRepairing)
	tracker.GrowTotals(uint64(len(plan.Extents)), 0)
	for _, r := range plan.Extents {
		fmt.Printf("extent %d: %d -> %v, stamp source %v, target %v\n",
			r.Extent, r.Source, r.Dests, r.SourceNeedsStamp(), r.Target)
		for range r.Dests {
			// Hashes fetched from the source and this destination.
			diff, _ := reconcile.DiffBlocks([]uint64{1, 2, 3, 4}, []uint64{1, 7, 8, 4})
			tracker.AddCompared(4)
			tracker.GrowTotals(0, uint64(len(diff))*blockSize)
			for _, run := range reconcile.Runs(diff) {
				fmt.Printf("  copy blocks %d..%d\n", run.Start, run.Start+reconcile.ExtentBlock(run.Count)-1)
				tracker.AddBytes(uint64(run.Count) * blockSize)
			}
		}
		tracker.ExtentDone()
	}
	tracker.Finish()
	p := tracker.Status()
	fmt.Printf("%s: %d/%d extents, %d bytes; first flush %d\n",
		p.Phase, p.ExtentsDone, p.ExtentsTotal, p.BytesDone, plan.NextFlush())
	// Output:
	// extent 1: 0 -> [2], stamp source true, target 5/9
	//   copy blocks 1..2
	// done: 1/1 extents, 8192 bytes; first flush 10
}

// The live-repair driver: walk extents with Next and Done while routing
// each guest write by RouteWrite.
func ExampleLiveRepair() {
	r := reconcile.NewLiveRepair(3)
	e, _ := r.Next() // extent 0 under repair
	fmt.Println(e, r.RouteWrite(0), r.RouteWrite(1), r.ServesReads())
	r.Done(e)
	e, _ = r.Next()
	fmt.Println(e, r.RouteWrite(0), r.RouteWrite(1), r.RouteWrite(2))
	r.Done(e)
	e, _ = r.Next()
	r.Done(e)
	fmt.Println(r.State(), r.RouteWrite(2), r.ServesReads())
	// Output:
	// 0 after-repair skip false
	// 1 send after-repair skip
	// complete send true
}

// A watcher that only cares about the end still sees it.
func ExampleTracker_Subscribe() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tracker := reconcile.NewTracker(func() time.Time { return now })
	updates, cancel := tracker.Subscribe(1)
	defer cancel()
	tracker.GrowTotals(800, 0)
	for range 800 {
		tracker.ExtentDone()
	}
	tracker.Finish()
	var last reconcile.Progress
	for p := range updates {
		last = p
	}
	fmt.Println(last.Phase, last.ExtentsDone, last.ExtentsTotal)
	// Output: done 800 800
}
