package chaos

import (
	"testing"
	"time"

	"tern/internal/testwait"
	"tern/volume/ids"
	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
)

// testRegion is every test's geometry: four 1 MiB extents of 4 KiB
// blocks, so 1024 blocks.
var testRegion = ClusterSpec{ExtentSize: "1MiB", ExtentCount: 4}

const testBlocks = 1024

// newUpstairs opens and activates an upstairs on targets at gen, closed
// at the end of the test.
func newUpstairs(t *testing.T, c *Cluster, targets []string, gen ids.Generation) *upstairs.Upstairs {
	t.Helper()
	u, err := openUpstairs(c, targets, gen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// waitReplica waits until replica r's state satisfies ok, failing the
// test after timeout.
func waitReplica(t *testing.T, u *upstairs.Upstairs, r int, timeout time.Duration, what string, ok func(engine.ReplicaState) bool) {
	t.Helper()
	var st upstairs.ReplicaStatus
	if !testwait.On(timeout, u.ReplicaStateChanged, func() bool { st = u.Status().Replicas[r]; return ok(st.State) }) {
		t.Fatalf("replica %d: %s: still %v after %v (fault %q, last error %q)", r, what, st.State, timeout, st.FaultReason, st.LastError)
	}
}

func isActive(s engine.ReplicaState) bool  { return s == engine.ReplicaActive }
func notActive(s engine.ReplicaState) bool { return s != engine.ReplicaActive }

// waitAcked waits until the workload acknowledged n more writes than from.
func waitAcked(t *testing.T, w *Workload, from int64, n int64) int64 {
	t.Helper()
	testwait.For(t, 2*time.Minute, "writes acknowledged", func() bool { return w.Stats().WritesAcked >= from+n })
	return w.Stats().WritesAcked
}
