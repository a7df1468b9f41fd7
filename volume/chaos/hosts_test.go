package chaos

import (
	"context"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
)

// replicaPort is where each downstairs listens in its own host.
const replicaPort = 3810

// hostsVolume is a volume on separate hosts: the upstairs host and one
// host per downstairs, on one bridge. The upstairs runs in this test
// process; its only way onto the network is through proxies[i], whose
// sockets towards replica i are opened inside the upstairs host's
// namespace, so every packet crosses the upstairs host's veth, the
// bridge and the replica host's veth.
type hostsVolume struct {
	net     *Network
	up      *Host
	ds      [3]*Host
	cluster *Cluster
	proxies [3]*Proxy
}

func newHostsVolume(t *testing.T) *hostsVolume {
	t.Helper()
	n, err := NewNetwork("up", "ds0", "ds1", "ds2")
	if errors.Is(err, ErrNotSupported) {
		if os.Getenv("CI") == "true" { // .ci/run runs as root, where they must work
			t.Fatalf("separate hosts need network namespaces, and CI must run these scenarios: %v", err)
		}
		t.Skipf("separate hosts need network namespaces: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("deleting namespaces: %v", err)
		}
	})
	v := &hostsVolume{net: n, up: n.Host("up")}
	spec := testRegion
	spec.Port = replicaPort
	for i := range v.ds {
		v.ds[i] = n.Hosts()[i+1]
		spec.Hosts[i] = v.ds[i]
	}
	c, err := NewCluster(ternBinary(t), t.TempDir(), spec)
	if err != nil {
		t.Fatal(err)
	}
	v.cluster = c
	t.Cleanup(func() { c.StopAll() })
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	for i, h := range v.ds {
		dial := func() (*net.UDPConn, error) { return v.up.ListenUDP(&net.UDPAddr{IP: v.up.IP}) }
		p, err := NewProxy("127.0.0.1:0", &net.UDPAddr{IP: h.IP, Port: replicaPort}, dial, uint64(i+1))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		v.proxies[i] = p
	}
	return v
}

func (v *hostsVolume) targets() []string {
	out := make([]string, len(v.proxies))
	for i, p := range v.proxies {
		out[i] = p.Addr().String()
	}
	return out
}

// checkConverged closes u, stops the replicas and compares their regions
// block by block.
func (v *hostsVolume) checkConverged(t *testing.T, u *upstairs.Upstairs) {
	t.Helper()
	if err := u.Close(); err != nil {
		t.Errorf("closing upstairs: %v", err)
	}
	if err := v.cluster.StopAll(); err != nil {
		t.Fatal(err)
	}
	differ, err := v.cluster.CompareRegions(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(differ) > 0 {
		t.Fatalf("replicas differ at blocks %v", differ)
	}
}

func verifyAll(t *testing.T, w *Workload, u *upstairs.Upstairs) VerifyReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := w.Verify(ctx, u, 64)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("verified %d blocks: %d ok, %d stale, %d lost, %d corrupt", rep.Blocks, rep.OK, rep.Stale, rep.Lost, rep.Corrupt)
	if rep.Violations() != 0 {
		t.Errorf("%d bad blocks; first: %s", rep.Violations(), rep.First)
	}
	return rep
}

func checkWorkload(t *testing.T, w *Workload) {
	t.Helper()
	s := w.Stats()
	t.Logf("workload: %d writes acknowledged, %d failed; %d flushes acknowledged, %d failed; %d reads verified, %d mismatched",
		s.WritesAcked, s.WritesFailed, s.FlushesAcked, s.FlushesFailed, s.ReadsVerified, s.Mismatches)
	if s.Mismatches != 0 || s.WritesFailed != 0 || s.FlushesFailed != 0 {
		t.Errorf("workload saw %d mismatched reads, %d failed writes, %d failed flushes", s.Mismatches, s.WritesFailed, s.FlushesFailed)
	}
}

var laneDefaults = LaneSpec{MaxIOBlocks: 8, FlushEvery: 8, ReadBack: true, IOTimeout: 3 * time.Minute}

// TestIOContinuesThroughACutReplicaLinkAndItCatchesUp cuts replica 2's
// host off both ways while two writers keep going, heals it, then cuts
// replica 1's host one way only (nothing it sends arrives) and heals
// that. Writes go on on two replicas throughout, each cut replica comes
// back Active, and at the end every block reads back as last written and
// the three regions hold the same blocks.
func TestIOContinuesThroughACutReplicaLinkAndItCatchesUp(t *testing.T) {
	v := newHostsVolume(t)
	u := newUpstairs(t, v.cluster, v.targets(), 1)
	w := NewWorkload(BlockSize, testBlocks, 11)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec := laneDefaults
	spec.Seed = 100
	l := w.StartLanes(ctx, u, 2, spec)
	defer l.Stop()
	acked := waitAcked(t, w, 0, 40)

	for _, cut := range []struct {
		replica int
		dir     Direction
	}{{2, Both}, {1, Outbound}, {0, Inbound}} {
		h := v.ds[cut.replica]
		if err := h.Cut(cut.dir); err != nil {
			t.Fatal(err)
		}
		waitReplica(t, u, cut.replica, time.Minute, "dropped after its link was cut "+cut.dir.String(), notActive)
		acked = waitAcked(t, w, acked, 40) // IO goes on on two
		if err := h.Heal(); err != nil {
			t.Fatal(err)
		}
		waitReplica(t, u, cut.replica, 2*time.Minute, "back after healing", isActive)
		t.Logf("replica %d cut %v: dropped, back Active; %d writes acknowledged so far", cut.replica, cut.dir, acked)
		acked = waitAcked(t, w, acked, 20)
	}
	if err := l.Stop(); err != nil {
		t.Fatal(err)
	}
	checkWorkload(t, w)
	verifyAll(t, w, u)
	v.checkConverged(t, u)
}

// TestNoAcknowledgementWithOnlyOneReplicaReachable cuts the hosts of
// replicas 1 and 2 off, leaving the upstairs one replica: a write and a
// flush submitted after the cut must not be acknowledged before the
// links heal, and must be soon after.
func TestNoAcknowledgementWithOnlyOneReplicaReachable(t *testing.T) {
	v := newHostsVolume(t)
	u := newUpstairs(t, v.cluster, v.targets(), 1)
	w := NewWorkload(BlockSize, testBlocks, 12)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec := laneDefaults
	spec.First, spec.Blocks, spec.Seed = 0, testBlocks/2, 200
	if err := w.RunLane(ctx, u, spec, nil, 30); err != nil {
		t.Fatal(err)
	}
	for _, r := range []int{1, 2} {
		if err := v.ds[r].Cut(Both); err != nil {
			t.Fatal(err)
		}
	}
	var healed atomic.Bool
	var earlyAcks atomic.Int64
	done := make(chan error, 1)
	go func() {
		spec := spec
		spec.First, spec.Seed, spec.ReadBack = testBlocks/2, 201, false
		spec.FlushEvery = 1 // the write, then a flush
		err := w.RunLane(ctx, u, spec, nil, 1)
		if !healed.Load() {
			earlyAcks.Add(1)
		}
		done <- err
	}()
	for _, r := range []int{1, 2} {
		waitReplica(t, u, r, time.Minute, "dropped after its host was cut off", notActive)
	}
	select {
	case err := <-done:
		t.Fatalf("the write and flush returned (%v) with only replica 0 reachable", err)
	default:
	}
	st := u.Status()
	t.Logf("cut off: replicas %v %v %v, %d jobs live", st.Replicas[0].State, st.Replicas[1].State, st.Replicas[2].State, st.LiveJobs)
	healed.Store(true)
	for _, r := range []int{1, 2} {
		if err := v.ds[r].Heal(); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Minute):
		t.Fatal("the write and flush were not acknowledged within 3 minutes of healing")
	}
	if earlyAcks.Load() != 0 {
		t.Fatal("acknowledged while only one replica was reachable")
	}
	for _, r := range []int{1, 2} {
		waitReplica(t, u, r, 2*time.Minute, "back after healing", isActive)
	}
	checkWorkload(t, w)
	verifyAll(t, w, u)
	v.checkConverged(t, u)
}

// TestWorkloadVerifiedThroughDelayAndLossOnEveryLink puts 20 ms of delay
// and 1 % loss on every link, both ways, through the proxies, then adds
// reordering and duplication; two writers read back every write.
func TestWorkloadVerifiedThroughDelayAndLossOnEveryLink(t *testing.T) {
	v := newHostsVolume(t)
	phases := []struct {
		name string
		imp  Impairment
	}{
		{"20 ms delay, 1 % loss", Impairment{Delay: 20 * time.Millisecond, Loss: 0.01}},
		{"20 ms ± 5 ms, 1 % loss, 2 % reordered by 10 ms, 1 % duplicated", Impairment{Delay: 20 * time.Millisecond,
			Jitter: 5 * time.Millisecond, Loss: 0.01, Reorder: 0.02, ReorderDelay: 10 * time.Millisecond, Duplicate: 0.01}},
	}
	for _, p := range v.proxies {
		if err := p.SetImpairment(phases[0].imp); err != nil {
			t.Fatal(err)
		}
	}
	u := newUpstairs(t, v.cluster, v.targets(), 1)
	w := NewWorkload(BlockSize, testBlocks, 13)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i, ph := range phases {
		for _, p := range v.proxies {
			if err := p.SetImpairment(ph.imp); err != nil {
				t.Fatal(err)
			}
		}
		spec := laneDefaults
		spec.Seed = 300 + uint64(10*i)
		start := time.Now()
		l := w.StartLanes(ctx, u, 2, spec)
		waitAcked(t, w, w.Stats().WritesAcked, 80)
		if err := l.Stop(); err != nil {
			t.Fatal(err)
		}
		var sum ProxyStats
		for _, p := range v.proxies {
			s := p.Stats()
			sum.Received += s.Received
			sum.Dropped += s.Dropped
			sum.Duplicated += s.Duplicated
		}
		t.Logf("%s: %d writes acknowledged in %v; proxies so far: %d datagrams, %d dropped, %d duplicated",
			ph.name, w.Stats().WritesAcked, time.Since(start).Round(time.Millisecond), sum.Received, sum.Dropped, sum.Duplicated)
		for r := range 3 {
			if st := u.Status().Replicas[r]; st.State != engine.ReplicaActive {
				t.Logf("replica %d %v: %s", r, st.State, st.FaultReason)
			}
		}
	}
	checkWorkload(t, w)
	verifyAll(t, w, u)
	v.checkConverged(t, u)
}

// TestUpstairsHostCutOffWaitsAndResumes cuts the upstairs host itself,
// first one way (nothing reaches it), then both ways: every replica is
// dropped, a write submitted meanwhile is not acknowledged until the cut
// heals, and then it is, with all three replicas back.
func TestUpstairsHostCutOffWaitsAndResumes(t *testing.T) {
	v := newHostsVolume(t)
	u := newUpstairs(t, v.cluster, v.targets(), 1)
	w := NewWorkload(BlockSize, testBlocks, 14)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec := laneDefaults
	spec.Seed = 400
	spec.Blocks = testBlocks
	if err := w.RunLane(ctx, u, spec, nil, 20); err != nil {
		t.Fatal(err)
	}
	for i, dir := range []Direction{Inbound, Both} {
		if err := v.up.Cut(dir); err != nil {
			t.Fatal(err)
		}
		var healed atomic.Bool
		done := make(chan bool, 1)
		go func() {
			s := spec
			s.Seed, s.FlushEvery = spec.Seed+uint64(i+1), 1
			w.RunLane(ctx, u, s, nil, 1)
			done <- healed.Load()
		}()
		for r := range 3 {
			waitReplica(t, u, r, time.Minute, "dropped after the upstairs host was cut "+dir.String(), notActive)
		}
		select {
		case <-done:
			t.Fatalf("cut %v: the write returned with no replica reachable", dir)
		default:
		}
		healed.Store(true)
		if err := v.up.Heal(); err != nil {
			t.Fatal(err)
		}
		select {
		case afterHeal := <-done:
			if !afterHeal {
				t.Fatalf("cut %v: acknowledged before healing", dir)
			}
		case <-time.After(3 * time.Minute):
			t.Fatalf("cut %v: the write was not acknowledged within 3 minutes of healing", dir)
		}
		for r := range 3 {
			waitReplica(t, u, r, 2*time.Minute, "back after healing", isActive)
		}
		t.Logf("upstairs host cut %v: all three dropped, IO waited, all back after healing", dir)
	}
	checkWorkload(t, w)
	verifyAll(t, w, u)
	v.checkConverged(t, u)
}

// TestReplicaCutPastItsBacklogIsRepairedLive keeps replica 1's host cut
// off until it owes more than its (small) backlog, so it is Faulted, not
// just Offline; after healing, live repair brings it back while the
// writers go on, and the replicas converge.
func TestReplicaCutPastItsBacklogIsRepairedLive(t *testing.T) {
	v := newHostsVolume(t)
	u, err := openUpstairsWith(v.cluster, v.targets(), 1, func(c *upstairs.Config) { c.BacklogJobs = 16 })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })
	w := NewWorkload(BlockSize, testBlocks, 15)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	spec := laneDefaults
	spec.Seed = 500
	l := w.StartLanes(ctx, u, 2, spec)
	defer l.Stop()
	acked := waitAcked(t, w, 0, 20)
	if err := v.ds[1].Cut(Both); err != nil {
		t.Fatal(err)
	}
	waitReplica(t, u, 1, 2*time.Minute, "faulted past its backlog", func(s engine.ReplicaState) bool { return s == engine.ReplicaFaulted })
	acked = waitAcked(t, w, acked, 40)
	if err := v.ds[1].Heal(); err != nil {
		t.Fatal(err)
	}
	waitReplica(t, u, 1, 2*time.Minute, "repaired live after healing", isActive)
	st := u.Status().Replicas[1]
	if st.Repair == nil {
		t.Fatal("replica 1 is Active again without a live repair")
	}
	t.Logf("replica 1 faulted, repaired live: %+v", *st.Repair)
	waitAcked(t, w, acked, 20)
	if err := l.Stop(); err != nil {
		t.Fatal(err)
	}
	checkWorkload(t, w)
	verifyAll(t, w, u)
	v.checkConverged(t, u)
}
