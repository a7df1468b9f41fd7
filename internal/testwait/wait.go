package testwait

import (
	"testing"
	"time"
)

// On waits until cond holds, calling it again each time the channel
// changed returns is closed (an owner's "something changed" broadcast).
// changed is called before cond, so a change between the two is not
// missed. It reports false if timeout passes first; the caller fails the
// test with what it was waiting for.
func On(timeout time.Duration, changed func() <-chan struct{}, cond func() bool) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		ch := changed()
		if cond() {
			return true
		}
		select {
		case <-ch:
		case <-deadline.C:
			return false
		}
	}
}

// pollEvery is how often Poll checks its condition.
const pollEvery = 5 * time.Millisecond

// Poll waits until cond holds, checking it every few milliseconds: for
// state that announces no change (kernel maps, counters, /proc). It
// reports false if timeout passes first.
func Poll(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		<-tick.C
	}
	return true
}

// For is Poll that fails t, saying what it waited for, when timeout
// passes first.
func For(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(timeout, cond) {
		t.Fatalf("%s: not within %v", what, timeout)
	}
}
