package reconcile

import (
	"reflect"
	"testing"
	"testing/synctest"
	"time"
)

func TestDecideQuorum(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var never time.Time
	const wait = DefaultQuorumWait
	tests := []struct {
		name       string
		answeredAt [ReplicaCount]time.Time
		now        time.Time
		wait       time.Duration
		want       QuorumVerdict
	}{
		{
			name:       "all three proceed at once",
			answeredAt: [3]time.Time{at(0), at(time.Second), at(2 * time.Second)},
			now:        at(2 * time.Second), wait: wait,
			want: QuorumVerdict{Proceed: true},
		},
		{
			name:       "two wait for the third",
			answeredAt: [3]time.Time{at(0), never, at(time.Second)},
			now:        at(3 * time.Second), wait: wait,
			want: QuorumVerdict{Missing: []ReplicaID{1}, RecheckAt: at(6 * time.Second)},
		},
		{
			name:       "the wait counts from the second answer",
			answeredAt: [3]time.Time{never, at(4 * time.Second), at(0)},
			now:        at(5 * time.Second), wait: wait,
			want: QuorumVerdict{Missing: []ReplicaID{0}, RecheckAt: at(9 * time.Second)},
		},
		{
			name:       "two proceed when the wait ends exactly",
			answeredAt: [3]time.Time{at(0), at(time.Second), never},
			now:        at(6 * time.Second), wait: wait,
			want: QuorumVerdict{Proceed: true, Missing: []ReplicaID{2}},
		},
		{
			name:       "two proceed after the wait",
			answeredAt: [3]time.Time{at(0), at(time.Second), never},
			now:        at(time.Minute), wait: wait,
			want: QuorumVerdict{Proceed: true, Missing: []ReplicaID{2}},
		},
		{
			name:       "zero wait proceeds on two at once",
			answeredAt: [3]time.Time{at(0), at(time.Second), never},
			now:        at(time.Second), wait: 0,
			want: QuorumVerdict{Proceed: true, Missing: []ReplicaID{2}},
		},
		{
			name:       "negative wait is zero",
			answeredAt: [3]time.Time{never, at(0), at(time.Second)},
			now:        at(time.Second), wait: -time.Hour,
			want: QuorumVerdict{Proceed: true, Missing: []ReplicaID{0}},
		},
		{
			name:       "one never proceeds however long",
			answeredAt: [3]time.Time{never, at(0), never},
			now:        at(time.Hour), wait: wait,
			want: QuorumVerdict{Missing: []ReplicaID{0, 2}},
		},
		{
			name: "none never proceeds",
			now:  at(time.Hour), wait: wait,
			want: QuorumVerdict{Missing: []ReplicaID{0, 1, 2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := DecideQuorum(tt.answeredAt, tt.now, tt.wait)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("DecideQuorum = %+v\n want %+v", got, tt.want)
			}
		})
	}
}

// TestQuorumDriverProceedsWithTwoAfterTheWait drives DecideQuorum the way
// the upstairs does — re-deciding on every answer and when RecheckAt's
// timer fires — in a synctest bubble, with the third replica never
// answering.
func TestQuorumDriverProceedsWithTwoAfterTheWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		answers := make(chan ReplicaID)
		go func() {
			time.Sleep(time.Second)
			answers <- 0
			time.Sleep(2 * time.Second)
			answers <- 2
		}()

		var answeredAt [ReplicaCount]time.Time
		var timer <-chan time.Time
		var v QuorumVerdict
		for !v.Proceed {
			select {
			case r := <-answers:
				answeredAt[r] = time.Now()
			case <-timer:
			}
			v = DecideQuorum(answeredAt, time.Now(), DefaultQuorumWait)
			if !v.RecheckAt.IsZero() {
				timer = time.After(time.Until(v.RecheckAt))
			}
		}
		if got, want := time.Since(start), 3*time.Second+DefaultQuorumWait; got != want {
			t.Errorf("proceeded after %v; want %v", got, want)
		}
		if !reflect.DeepEqual(v.Missing, []ReplicaID{1}) {
			t.Errorf("Missing = %v; want [1] (to live repair)", v.Missing)
		}
	})
}
