package chaos

import (
	"testing"
	"time"
)

// waitFor polls cond every few milliseconds until it holds, failing the
// test after timeout: for counters and /proc figures that announce no
// change.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		<-tick.C
	}
}
