package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"tern/volume/ids"
	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
)

// CrashSpec is a crash campaign: a workload with periodic flushes on
// three real downstairs processes, which are SIGKILLed at seeded random
// moments (counted in acknowledged writes) and restarted.
type CrashSpec struct {
	Seed uint64
	// Rounds is how many kill rounds to run; each kills one, two or all
	// three replicas.
	Rounds int
	// Lanes and Lane are the workload (Lane.Seed is derived from Seed).
	Lanes int
	Lane  LaneSpec
	// MaxAcksBetween bounds the writes acknowledged before each kill, and
	// before the restart when one replica was killed (IO goes on on two).
	MaxAcksBetween int
	// RecoverTimeout bounds each wait for the volume to recover.
	RecoverTimeout time.Duration
	// BacklogJobs, if set, is the upstairs' Config.BacklogJobs: small, a
	// killed replica overflows it and comes back through live repair,
	// which the next kill may interrupt.
	BacklogJobs int
	// OnStuck, if set, is called while the volume is still up when a wait
	// for it times out (tests dump goroutines there).
	OnStuck func()
}

// Kill kinds counted by CrashResult.KillsByKind.
const (
	KillOne   = "one replica"
	KillTwo   = "two replicas"
	KillThree = "all three"
)

// CrashResult is what a campaign did and found.
type CrashResult struct {
	Rounds, Kills, Restarts int
	KillsByKind             map[string]int
	Workload                WorkloadStats
	Verify                  VerifyReport
	// Differing counts blocks not identical on the three regions after
	// the final repair (at most 100 are looked for).
	Differing int
}

// Violations is every invariant the campaign found broken.
func (r CrashResult) Violations() int64 {
	return r.Verify.Violations() + r.Workload.Mismatches + int64(r.Differing)
}

// RunCrashCampaign runs spec on c, whose replicas must not be running, at
// generations gen (the workload) and gen+1 (the repair and verify after
// it). It returns an error when the campaign could not run to its end; a
// broken invariant is in the result, not an error.
func RunCrashCampaign(ctx context.Context, c *Cluster, w *Workload, spec CrashSpec, gen ids.Generation, logf func(string, ...any)) (CrashResult, error) {
	res := CrashResult{KillsByKind: map[string]int{}}
	r := rand.New(rand.NewPCG(spec.Seed, spec.Seed^0x2545f4914f6cdd1d))
	if err := c.StartAll(); err != nil {
		return res, err
	}
	u, err := openUpstairsWith(c, c.Addrs(), gen, func(cfg *upstairs.Config) { cfg.BacklogJobs = spec.BacklogJobs })
	if err != nil {
		return res, err
	}
	defer u.Close()
	lane := spec.Lane
	lane.Seed = spec.Seed * 1000
	lanes := w.StartLanes(ctx, u, spec.Lanes, lane)
	defer lanes.Stop()
	acked := w.Stats().WritesAcked
	for round := range spec.Rounds {
		if acked, err = waitMoreAcks(ctx, w, acked, 1+r.IntN(spec.MaxAcksBetween), spec.RecoverTimeout); err != nil {
			return res, fmt.Errorf("round %d, before the kill: %w; %s", round, err, describeStatus(u.Status()))
		}
		victims, kind := pickVictims(r)
		for _, v := range victims {
			if err := c.Replicas[v].Kill(); err != nil {
				return res, err
			}
			res.Kills++
		}
		res.KillsByKind[kind]++
		if len(victims) == 1 {
			if acked, err = waitMoreAcks(ctx, w, acked, 1+r.IntN(spec.MaxAcksBetween), spec.RecoverTimeout); err != nil {
				if spec.OnStuck != nil {
					spec.OnStuck()
				}
				return res, fmt.Errorf("round %d, IO on two replicas after killing %d: %w; %s", round, victims[0], err, describeStatus(u.Status()))
			}
		}
		for _, v := range victims {
			if err := c.Replicas[v].Start(); err != nil {
				return res, fmt.Errorf("round %d: restarting replica %d: %w", round, v, err)
			}
			res.Restarts++
		}
		if err := waitAllActive(ctx, u, spec.RecoverTimeout); err != nil {
			return res, fmt.Errorf("round %d, after killing %v: %w", round, victims, err)
		}
		res.Rounds++
		if logf != nil {
			logf("round %d: killed %v (%s), restarted, all Active; %d writes acknowledged", round, victims, kind, w.Stats().WritesAcked)
		}
	}
	if err := lanes.Stop(); err != nil {
		return res, fmt.Errorf("workload: %w", err)
	}
	res.Workload = w.Stats()
	if err := u.Close(); err != nil {
		return res, fmt.Errorf("closing upstairs: %w", err)
	}

	// A new upstairs at a higher generation reconciles the replicas on
	// activation; then every block is read back.
	u2, err := openUpstairs(c, c.Addrs(), gen+1)
	if err != nil {
		return res, fmt.Errorf("repairing: %w", err)
	}
	res.Verify, err = w.Verify(ctx, u2, 64)
	if cerr := u2.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("closing verifying upstairs: %w", cerr)
	}
	if err != nil {
		return res, err
	}
	if err := c.StopAll(); err != nil {
		return res, err
	}
	differ, err := c.CompareRegions(ctx, 100)
	res.Differing = len(differ)
	return res, err
}

// pickVictims draws which replicas a round kills: usually one, sometimes
// two (IO stops until they return), rarely all three.
func pickVictims(r *rand.Rand) ([]int, string) {
	perm := r.Perm(3)
	switch x := r.IntN(10); {
	case x < 6:
		return perm[:1], KillOne
	case x < 9:
		return perm[:2], KillTwo
	default:
		return perm, KillThree
	}
}

func waitMoreAcks(ctx context.Context, w *Workload, from int64, n int, timeout time.Duration) (int64, error) {
	if err := w.WaitAcked(ctx, from+int64(n), timeout); err != nil {
		return 0, err
	}
	return w.Stats().WritesAcked, nil
}

// waitAllActive waits until every replica is Active.
func waitAllActive(ctx context.Context, u *upstairs.Upstairs, timeout time.Duration) error {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		changed := u.ReplicaStateChanged()
		st := u.Status()
		all := true
		for _, r := range st.Replicas {
			all = all && r.State == engine.ReplicaActive
		}
		if all {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			return fmt.Errorf("waiting for all replicas Active: not within %v: %v %v %v (%s; %s; %s)", timeout,
				st.Replicas[0].State, st.Replicas[1].State, st.Replicas[2].State,
				st.Replicas[0].FaultReason, st.Replicas[1].FaultReason, st.Replicas[2].FaultReason)
		}
	}
}

// describeStatus is the upstairs' replicas in one line, for errors.
func describeStatus(st upstairs.Status) string {
	out := fmt.Sprintf("%d jobs live (%d bytes)", st.LiveJobs, st.LiveBytes)
	for i, r := range st.Replicas {
		out += fmt.Sprintf("; replica %d %v owes %d jobs, fault %q, last error %q", i, r.State, r.OutstandingJobs, r.FaultReason, r.LastError)
		if r.Repair != nil {
			out += fmt.Sprintf(" repair %s %d/%d extents", r.Repair.Phase, r.Repair.ExtentsDone, r.Repair.ExtentsTotal)
		}
	}
	return out
}
