package reconcile

import (
	"errors"
	"math/rand/v2"
	"tern/volume/ids"
	"testing"
)

// liveRepairAt returns a repair of 5 extents that has repaired the first
// repaired extents and, if underRepair, handed out the next one.
func liveRepairAt(t *testing.T, repaired int, underRepair bool) *LiveRepair {
	t.Helper()
	r := NewLiveRepair(5)
	for e := range repaired {
		if _, ok := r.Next(); !ok {
			t.Fatalf("Next after %d: not running", e)
		}
		if err := r.Done(ids.ExtentID(e)); err != nil {
			t.Fatal(err)
		}
	}
	if underRepair {
		r.Next()
	}
	return r
}

func TestLiveRepairRoutesWritesByExtent(t *testing.T) {
	aborted := func(t *testing.T) *LiveRepair {
		r := liveRepairAt(t, 2, true)
		r.Abort()
		return r
	}
	tests := []struct {
		name  string
		setup func(*testing.T) *LiveRepair
		want  [5]WriteRoute // for extents 0..4
	}{
		{
			name:  "fresh repair skips everything",
			setup: func(t *testing.T) *LiveRepair { return liveRepairAt(t, 0, false) },
			want:  [5]WriteRoute{WriteSkip, WriteSkip, WriteSkip, WriteSkip, WriteSkip},
		},
		{
			name:  "first extent under repair holds its writes",
			setup: func(t *testing.T) *LiveRepair { return liveRepairAt(t, 0, true) },
			want:  [5]WriteRoute{WriteAfterRepair, WriteSkip, WriteSkip, WriteSkip, WriteSkip},
		},
		{
			name:  "below sends, at holds, above skips",
			setup: func(t *testing.T) *LiveRepair { return liveRepairAt(t, 2, true) },
			want:  [5]WriteRoute{WriteSend, WriteSend, WriteAfterRepair, WriteSkip, WriteSkip},
		},
		{
			name:  "between extents the next one is still skipped",
			setup: func(t *testing.T) *LiveRepair { return liveRepairAt(t, 2, false) },
			want:  [5]WriteRoute{WriteSend, WriteSend, WriteSkip, WriteSkip, WriteSkip},
		},
		{
			name:  "last extent under repair",
			setup: func(t *testing.T) *LiveRepair { return liveRepairAt(t, 4, true) },
			want:  [5]WriteRoute{WriteSend, WriteSend, WriteSend, WriteSend, WriteAfterRepair},
		},
		{
			name:  "complete sends everything",
			setup: func(t *testing.T) *LiveRepair { return liveRepairAt(t, 5, false) },
			want:  [5]WriteRoute{WriteSend, WriteSend, WriteSend, WriteSend, WriteSend},
		},
		{
			name:  "aborted skips everything",
			setup: aborted,
			want:  [5]WriteRoute{WriteSkip, WriteSkip, WriteSkip, WriteSkip, WriteSkip},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.setup(t)
			for e, want := range tt.want {
				if got := r.RouteWrite(ids.ExtentID(e)); got != want {
					t.Errorf("RouteWrite(%d) = %v; want %v", e, got, want)
				}
			}
			if got, want := r.ServesReads(), r.State() == LiveRepairComplete; got != want {
				t.Errorf("ServesReads = %v in state %v", got, r.State())
			}
		})
	}
}

func TestLiveRepairExtentLimit(t *testing.T) {
	tests := []struct {
		name        string
		repaired    int
		underRepair bool
		abort       bool
		want        ids.ExtentID
		wantOK      bool
	}{
		{"nothing repaired", 0, false, false, 0, false},
		{"first under repair", 0, true, false, 0, true},
		{"two repaired", 2, false, false, 1, true},
		{"third under repair", 2, true, false, 2, true},
		{"complete", 5, false, false, 4, true},
		{"aborted", 2, true, true, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := liveRepairAt(t, tt.repaired, tt.underRepair)
			if tt.abort {
				r.Abort()
			}
			got, ok := r.ExtentLimit()
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("ExtentLimit = %d, %v; want %d, %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestLiveRepairWalksEveryExtentOnceThenIsActive(t *testing.T) {
	r := NewLiveRepair(3)
	var walked []ids.ExtentID
	for {
		e, ok := r.Next()
		if !ok {
			break
		}
		if again, _ := r.Next(); again != e {
			t.Fatalf("Next again = %d; want the extent under repair %d", again, e)
		}
		if u, ok := r.UnderRepair(); !ok || u != e {
			t.Fatalf("UnderRepair = %d, %v; want %d", u, ok, e)
		}
		walked = append(walked, e)
		if err := r.Done(e); err != nil {
			t.Fatal(err)
		}
		if r.Repaired() != uint32(len(walked)) {
			t.Fatalf("Repaired = %d after %d", r.Repaired(), len(walked))
		}
	}
	if len(walked) != 3 || walked[0] != 0 || walked[1] != 1 || walked[2] != 2 {
		t.Errorf("walked %v; want [0 1 2]", walked)
	}
	if r.State() != LiveRepairComplete {
		t.Errorf("State = %v; want complete", r.State())
	}
	if _, ok := r.UnderRepair(); ok {
		t.Error("an extent is under repair after completion")
	}
}

func TestLiveRepairOfNoExtentsIsCompleteAtOnce(t *testing.T) {
	r := NewLiveRepair(0)
	if _, ok := r.Next(); ok || r.State() != LiveRepairComplete {
		t.Errorf("state %v, Next ok %v; want complete with nothing to do", r.State(), ok)
	}
	if _, ok := r.ExtentLimit(); ok {
		t.Error("ExtentLimit ok for an empty region")
	}
}

func TestLiveRepairDoneRejectsOutOfTurn(t *testing.T) {
	r := NewLiveRepair(3)
	if err := r.Done(0); !errors.Is(err, ErrNotUnderRepair) {
		t.Errorf("Done before Next: %v; want ErrNotUnderRepair", err)
	}
	r.Next()
	if err := r.Done(1); !errors.Is(err, ErrNotUnderRepair) {
		t.Errorf("Done(1) with 0 under repair: %v; want ErrNotUnderRepair", err)
	}
	r.Abort()
	if err := r.Done(0); !errors.Is(err, ErrNotRunning) {
		t.Errorf("Done after Abort: %v; want ErrNotRunning", err)
	}
}

func TestAbortedLiveRepairIsFaultedAndRetriesFromScratch(t *testing.T) {
	r := liveRepairAt(t, 2, true)
	r.Abort()
	if r.State() != LiveRepairAborted {
		t.Fatalf("State = %v; want aborted", r.State())
	}
	if _, ok := r.Next(); ok {
		t.Error("Next handed out an extent after Abort")
	}
	if err := r.Retry(); err != nil {
		t.Fatal(err)
	}
	if e, ok := r.Next(); !ok || e != 0 || r.Repaired() != 0 {
		t.Errorf("after Retry Next = %d, %v with %d repaired; want extent 0 from scratch", e, ok, r.Repaired())
	}
	if err := r.Retry(); !errors.Is(err, ErrNotAborted) {
		t.Errorf("Retry while running: %v; want ErrNotAborted", err)
	}
	done := liveRepairAt(t, 5, false)
	done.Abort() // no effect on a complete repair
	if done.State() != LiveRepairComplete {
		t.Errorf("Abort changed a complete repair to %v", done.State())
	}
}

func TestLiveRepairNeeded(t *testing.T) {
	tests := []struct {
		source, target Version
		want           bool
	}{
		{clean(2, 5), clean(2, 5), false},
		{clean(2, 5), clean(2, 4), true},
		{clean(2, 5), clean(1, 5), true},
		{clean(2, 5), dirty(2, 5), true},
		{dirty(2, 5), dirty(2, 5), true},
		{clean(2, 5), clean(3, 1), true},
	}
	for _, tt := range tests {
		if got := LiveRepairNeeded(tt.source, tt.target); got != tt.want {
			t.Errorf("LiveRepairNeeded(%v, %v) = %v; want %v", tt.source, tt.target, got, tt.want)
		}
	}
}

// TestLiveRepairRoutingLosesNoWrite simulates a live repair of a small
// region interleaved with seeded random guest writes, applying each write
// to the source at once and to the target as RouteWrite says, and the
// repair as a copy at a random point between Next and Done. Whatever the
// interleaving, the target must end equal to the source.
func TestLiveRepairRoutingLosesNoWrite(t *testing.T) {
	const extents, blocks = 4, 3
	rng := rand.New(rand.NewPCG(3, 5))
	for iter := range 2000 {
		var source, target [extents][blocks]int
		for e := range extents {
			for b := range blocks {
				source[e][b] = rng.IntN(100)
				target[e][b] = -1 // stale
			}
		}
		r := NewLiveRepair(extents)
		var held [][3]int // writes held behind the current extent's repair
		copied := false
		write := func() {
			e, b, val := rng.IntN(extents), rng.IntN(blocks), rng.IntN(1000)
			source[e][b] = val
			switch r.RouteWrite(ids.ExtentID(e)) {
			case WriteSend:
				target[e][b] = val
			case WriteAfterRepair:
				held = append(held, [3]int{e, b, val})
			case WriteSkip:
			default:
				t.Fatalf("no route for extent %d", e)
			}
		}
		for r.State() == LiveRepairRunning {
			switch rng.IntN(5) {
			case 0:
				r.Next()
			case 1:
				if e, ok := r.UnderRepair(); ok && !copied {
					// The copy is ordered after every write submitted
					// before Next, which the source already holds.
					target[e] = source[e]
					copied = true
				}
			case 2:
				if e, ok := r.UnderRepair(); ok && copied {
					for _, w := range held { // released after the repair
						target[w[0]][w[1]] = w[2]
					}
					held, copied = nil, false
					if err := r.Done(e); err != nil {
						t.Fatal(err)
					}
				}
			default:
				write()
			}
		}
		for range 3 {
			write()
		}
		if target != source {
			t.Fatalf("iter %d: target %v != source %v", iter, target, source)
		}
	}
}
