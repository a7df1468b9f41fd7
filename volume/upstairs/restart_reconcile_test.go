package upstairs

import (
	"bytes"
	"context"
	"testing"

	"tern/volume/extent"
	"tern/volume/upstairs/engine"
)

// writeVolume writes pattern seed over n blocks from first through u and
// into model.
func writeVolume(t *testing.T, u *Upstairs, model []byte, first, n int64, seed uint64) {
	t.Helper()
	p := make([]byte, n*testBlockSize)
	FillPattern(p, testBlockSize, uint64(first), seed)
	if _, err := u.WriteAt(ctxT(t), p, first*testBlockSize); err != nil {
		t.Fatalf("writing blocks %d+%d: %v", first, n, err)
	}
	copy(model[first*testBlockSize:], p)
}

// Every replica restarts at once after acknowledged, unflushed writes
// (each says ActivateAck.LostWrites): no replica is Active to live-repair
// the others from, which stalled the volume for good when they were
// faulted and live-repaired (the crash campaign of tern/volume/chaos),
// and replaying their backlogs over them serves lost writes' older data
// (the simulation of tern/volume/sim). The upstairs holds the three
// sessions, reconciles the replicas as at activation, replays every live
// job, and resumes: the write issued while all three were down waits and
// succeeds, the flushed and the unflushed writes one replica kept survive,
// a block torn on another is mended from its peers, and the replicas end
// block-for-block identical.
func TestEveryReplicaRestartingAfterUnflushedWritesReconcilesAndResumes(t *testing.T) {
	cl, want := tornCluster(t)
	if err := cl.StartAll(); err != nil {
		t.Fatal(err)
	}
	targets := cl.Targets()
	u, err := New(tornConfig(t, cl, targets))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if err := u.Activate(ctxT(t), 2); err != nil {
		t.Fatalf("Activate: %v", err)
	}
	writeVolume(t, u, want, 3, 2, 2) // flushed
	if err := u.Flush(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	writeVolume(t, u, want, 70, 3, 3)  // acknowledged, never flushed
	writeVolume(t, u, want, 140, 1, 4) // likewise

	for i := range engine.ReplicaCount {
		if err := cl.Stop(i); err != nil {
			t.Fatal(err)
		}
	}
	for r := range engine.ReplicaCount { // none comes back: each stays offline
		waitState(t, u, r, engine.ReplicaOffline)
	}
	// The crash cost replica 2 the unflushed write to block 140 (its
	// older data is back, the extent dirty), and tore block 200 on
	// replica 1, which it was writing for a caller never answered.
	onDisk(t, cl, 2, func(r *extent.Region) { writeSeed(t, r, nil, 140, 1, 1) })
	tear(t, cl, 1, 200, 9)

	// IO issued while every replica is down waits for them.
	late := make([]byte, 2*testBlockSize)
	FillPattern(late, testBlockSize, 300, 5)
	copy(want[300*testBlockSize:], late)
	wrote := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	go func() {
		_, err := u.WriteAt(ctx, late, 300*testBlockSize)
		wrote <- err
	}()

	for i := range engine.ReplicaCount {
		if err := cl.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-wrote; err != nil {
		t.Fatalf("write issued while every replica was down: %v", err)
	}
	for r := range engine.ReplicaCount {
		waitState(t, u, r, engine.ReplicaActive)
	}
	u.mu.Lock()
	done, tracker := u.restart.done, u.restart.tracker
	u.mu.Unlock()
	if done != 1 {
		t.Fatalf("%d restart reconciliations; want 1", done)
	}
	if p := tracker.Status(); p.ExtentsTotal == 0 || p.ExtentsDone != p.ExtentsTotal {
		t.Errorf("restart reconciliation progress %+v; want every planned extent done", p)
	}
	for r := range engine.ReplicaCount {
		if p, ok := u.LiveRepairProgress(r); ok {
			t.Errorf("replica %d was live-repaired (%+v); want all three reconciled together", r, p)
		}
	}
	if got := readVolume(t, u); !bytes.Equal(got, want) {
		t.Error("volume reads differ from the expected data")
	}
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	requireIdenticalOnDisk(t, cl, want)
}
