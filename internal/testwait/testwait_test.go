package testwait

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestOnWakesOnEachChange(t *testing.T) {
	var mu sync.Mutex
	changed := make(chan struct{})
	n := 0
	current := func() <-chan struct{} { mu.Lock(); defer mu.Unlock(); return changed }
	go func() {
		for range 3 {
			mu.Lock()
			n++
			close(changed)
			changed = make(chan struct{})
			mu.Unlock()
		}
	}()
	if !On(time.Minute, current, func() bool { mu.Lock(); defer mu.Unlock(); return n == 3 }) {
		t.Fatal("On did not see the third change within a minute")
	}
}

func TestOnReportsTheDeadline(t *testing.T) {
	never := make(chan struct{})
	if On(10*time.Millisecond, func() <-chan struct{} { return never }, func() bool { return false }) {
		t.Fatal("On reported a condition that never held")
	}
}

func TestPoll(t *testing.T) {
	var n atomic.Int32
	go func() { n.Store(1) }()
	if !Poll(time.Minute, func() bool { return n.Load() == 1 }) {
		t.Fatal("Poll did not see the store within a minute")
	}
	if Poll(10*time.Millisecond, func() bool { return false }) {
		t.Fatal("Poll reported a condition that never held")
	}
}

func TestReturnedWaitsForStartedGoroutines(t *testing.T) {
	g := Running()
	release := make(chan struct{})
	for range 4 {
		go func() { <-release }()
	}
	if left := g.started(); len(left) != 4 {
		t.Fatalf("%d goroutines seen as started; want 4", len(left))
	}
	close(release)
	g.Returned(t, time.Minute)
}

func TestRunningIgnoresGoroutinesThatWereThere(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	go func() { <-release }()
	g := Running()
	if left := g.started(); len(left) != 0 {
		t.Fatalf("goroutines already running seen as started: %d", len(left))
	}
}

func TestForFailsNamingWhatItWaitedFor(t *testing.T) {
	ft := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		For(ft, 10*time.Millisecond, "the moon", func() bool { return false })
	}()
	<-done
	if ft.msg != "the moon: not within 10ms" {
		t.Fatalf("message %q", ft.msg)
	}
}

// fatalRecorder records Fatalf instead of failing the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Helper() {}

func (f *fatalRecorder) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
