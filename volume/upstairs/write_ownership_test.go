package upstairs

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tern/volume/wire"
)

// TestLaggingReplicaNeverSendsReleasedWriteBuffers: a write that two
// replicas applied returns while the third still has it queued; its data
// is copied out of the caller's buffer first (privatized), and the third
// replica must send that copy. The test holds replica 0's sender on an
// earlier write so a second write B queues behind it, then, while B is
// being privatized (the driver's lock released), lets the sender go on.
// If the sender could take B then, it would encode B from the caller's
// buffer and the waiter's pooled hashes after WriteAt returned and the
// caller reused both: the race detector reports that, and without it the
// replicas may end up holding different data.
func TestLaggingReplicaNeverSendsReleasedWriteBuffers(t *testing.T) {
	c := newCluster(t)
	u, err := New(c.config())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.Close() })

	const lagging = 0
	var (
		armed      atomic.Bool
		stalledID  atomic.Uint64 // the write replica 0's sender is held on
		stalled    = make(chan struct{})
		release    = make(chan struct{})
		afterHold  = make(chan wire.JobID, 1) // what the sender picked once released
		privatized sync.Once
	)
	u.ioHooks = &ioHooks{
		sendPicked: func(r int, id wire.JobID) {
			if r != lagging || !armed.Load() {
				return
			}
			if id != 0 && stalledID.CompareAndSwap(0, uint64(id)) {
				close(stalled)
				<-release
				return
			}
			select {
			case <-release:
				select {
				case afterHold <- id:
				default:
				}
			default:
			}
		},
		privatizing: func(id wire.JobID) {
			held := wire.JobID(stalledID.Load())
			if held == 0 || id == held {
				return
			}
			privatized.Do(func() {
				// B is being copied: let the sender finish the held write
				// and choose its next job before the copy completes.
				close(release)
				select {
				case <-afterHold:
				case <-time.After(testTimeout):
					t.Error("replica 0's sender never chose a job after it was released")
				}
			})
		},
	}
	ctx := ctxT(t)
	if err := u.Activate(ctx, 1); err != nil {
		t.Fatal(err)
	}

	m := &model{data: make([]byte, volumeBytes())}
	extentBytes := int64(testExtentBlocks * testBlockSize)
	write := func(p []byte, off int64, fill byte) {
		t.Helper()
		for k := range p {
			p[k] = fill + byte(k)
		}
		if _, err := u.WriteAt(ctx, p, off); err != nil {
			t.Errorf("write at %d: %v", off, err)
			return
		}
		m.write(p, off)
	}

	armed.Store(true)
	var writers sync.WaitGroup
	writers.Go(func() { write(make([]byte, extentBytes), 0, 1) }) // A: held on replica 0
	select {
	case <-stalled:
	case <-time.After(testTimeout):
		t.Fatal("replica 0's sender never took the first write")
	}
	writers.Go(func() {
		// B queues behind A on replica 0; once WriteAt returns, this
		// goroutine reuses the buffer and (through the pool) the hashes.
		p := make([]byte, extentBytes)
		write(p, extentBytes, 2)
		for i := range 4 {
			write(p, extentBytes, byte(10+i))
		}
	})
	writers.Wait()
	if t.Failed() {
		return
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, volumeBytes())
	if _, err := u.ReadAt(context.Background(), got, 0); err != nil {
		t.Fatal(err)
	}
	m.check(t, got, 0)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	c.requireSameReplicas(m.data)
}
