package main

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"tern/internal/tlsconf"
	"tern/volume/upstairs"
	"tern/volume/upstairs/engine"
)

// deadReplicaBound is what the test asserts about detection: generous, as
// the machine may be loaded; the figure itself is logged.
const deadReplicaBound = 30 * time.Second

// TestKilledDownstairsIsDroppedWithinTheIdleTimeout SIGKILLs one of three
// real downstairs processes while an upstairs keeps writing to the volume:
// no goodbye reaches the upstairs, only silence. The replica must be
// dropped within 5 s (the connection idle timeout is 4 s by default), not
// the 30 s it used to take, and writes must go on on the other two. (Until
// then this one-deep fill waits: the write being sent to the dead replica
// keeps its caller's buffer, which the stuck send still reads.)
func TestKilledDownstairsIsDroppedWithinTheIdleTimeout(t *testing.T) {
	v := startVolumeProcesses(t)
	bundle, err := tlsconf.Load(v.certs)
	if err != nil {
		t.Fatal(err)
	}
	u, err := upstairs.New(upstairs.Config{Targets: v.addrs[:], TLS: bundle.ClientConfig("")})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*deadReplicaBound)
	defer cancel()
	if err := u.Activate(ctx, 1); err != nil {
		t.Fatal(err)
	}

	// The fill: 256 KiB writes round the 4 MiB volume until stopped.
	var written atomic.Int64
	var writeErr error
	stop := make(chan struct{})
	var filler sync.WaitGroup
	filler.Go(func() {
		p := make([]byte, 256<<10)
		for i := int64(0); ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			p[0] = byte(i)
			if _, err := u.WriteAt(ctx, p, i%16*int64(len(p))); err != nil {
				writeErr = err
				return
			}
			written.Add(int64(len(p)))
		}
	})
	defer func() {
		close(stop)
		filler.Wait()
		if writeErr != nil {
			t.Errorf("write: %v", writeErr)
		}
	}()
	waitWritten(t, &written, 4<<20) // warmed up
	rateBefore := fillRate(t, &written, 8<<20)

	const victim = 2
	before := written.Load()
	killed := time.Now()
	v.running[victim].proc.Kill()
	v.running[victim] = nil

	var st upstairs.ReplicaStatus
	for {
		changed := u.ReplicaStateChanged()
		st = u.Status().Replicas[victim]
		if st.State != engine.ReplicaActive {
			break
		}
		select {
		case <-changed:
		case <-time.After(deadReplicaBound - time.Since(killed)):
			t.Fatalf("replica %d still active %v after its process was killed", victim, time.Since(killed))
		}
	}
	detected := st.FaultedAt.Sub(killed)
	during := written.Load() - before
	t.Logf("killed downstairs detected after %v (idle timeout %v): replica %v, reason %q; %d MiB written meanwhile",
		detected.Round(time.Millisecond), upstairs.DefaultIdleTimeout, st.State, st.FaultReason, during>>20)
	if detected > deadReplicaBound {
		t.Fatalf("detection took %v, want well under %v", detected, deadReplicaBound)
	}
	// The other two carry the fill on.
	t.Logf("fill: %.0f MiB/s on three replicas, %.0f MiB/s on two after the drop",
		rateBefore, fillRate(t, &written, 8<<20))
}

// fillRate waits for the fill to write n more bytes and returns its rate
// meanwhile in MiB/s.
func fillRate(t *testing.T, written *atomic.Int64, n int64) float64 {
	t.Helper()
	start, from := time.Now(), written.Load()
	waitWritten(t, written, from+n)
	return float64(written.Load()-from) / (1 << 20) / time.Since(start).Seconds()
}

// waitWritten waits until the fill wrote n bytes in all, giving up after
// deadReplicaBound.
func waitWritten(t *testing.T, written *atomic.Int64, n int64) {
	t.Helper()
	deadline := time.Now().Add(deadReplicaBound)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for written.Load() < n {
		if time.Now().After(deadline) {
			t.Fatalf("the fill wrote %d of %d bytes within %v", written.Load(), n, deadReplicaBound)
		}
		<-tick.C
	}
}
