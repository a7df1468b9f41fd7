package downstairs

import (
	"slices"
	"testing"

	"tern/volume/wire"
)

func rd(id wire.JobID, first, end uint64, deps ...wire.JobID) jobKey {
	return jobKey{id: id, deps: deps, mode: accessRead, first: first, end: end}
}
func wr(id wire.JobID, first, end uint64, deps ...wire.JobID) jobKey {
	return jobKey{id: id, deps: deps, mode: accessWrite, first: first, end: end}
}
func fl(id wire.JobID, deps ...wire.JobID) jobKey {
	return jobKey{id: id, deps: deps, mode: accessFlush}
}
func meta(id wire.JobID) jobKey { return jobKey{id: id, mode: accessMeta} }

func TestConflictTable(t *testing.T) {
	cases := []struct {
		name string
		a, b jobKey
		want bool
	}{
		{"reads never conflict", rd(1, 0, 10), rd(2, 5, 15), false},
		{"overlapping write and read", wr(1, 0, 10), rd(2, 9, 15), true},
		{"adjacent write and read", wr(1, 0, 10), rd(2, 10, 15), false},
		{"overlapping writes", wr(1, 0, 10), wr(2, 3, 4), true},
		{"disjoint writes", wr(1, 0, 10), wr(2, 20, 30), false},
		{"flush after write", wr(1, 0, 1), fl(2), true},
		{"write after flush", fl(1), wr(2, 100, 101), true},
		{"flush and read", fl(1), rd(2, 0, 1), false},
		{"flush and flush", fl(1), fl(2), true},
		{"meta and write", meta(1), wr(2, 0, 1), true},
		{"meta and read", meta(1), rd(2, 0, 1), false},
		{"meta and flush", fl(1), meta(2), true},
		{"meta and meta", meta(1), meta(2), false},
	}
	for _, tc := range cases {
		if got := conflicts(&tc.a, &tc.b); got != tc.want {
			t.Errorf("%s: conflicts = %v, want %v", tc.name, got, tc.want)
		}
		if got := conflicts(&tc.b, &tc.a); got != tc.want {
			t.Errorf("%s (swapped): conflicts = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// step is one scripted engine input and the expected decision.
type step struct {
	submit   *jobKey
	complete wire.JobID
	want     []wire.JobID // jobs that start running at this step
}

func sub(k jobKey, starts ...wire.JobID) step { return step{submit: &k, want: starts} }
func done(id wire.JobID, starts ...wire.JobID) step {
	return step{complete: id, want: starts}
}

func TestEngineScripts(t *testing.T) {
	scripts := []struct {
		name  string
		steps []step
	}{
		{"independent jobs run concurrently", []step{
			sub(wr(1, 0, 8), 1), sub(wr(2, 8, 16), 2), sub(rd(3, 16, 24), 3),
			done(2), done(1), done(3),
		}},
		{"listed dependency waits", []step{
			sub(wr(1, 0, 8), 1), sub(rd(2, 100, 108, 1)),
			done(1, 2), done(2),
		}},
		{"dependency already completed does not wait", []step{
			sub(wr(1, 0, 8), 1), done(1), sub(rd(2, 0, 8, 1), 2),
		}},
		{"earlier overlapping write orders a read without deps", []step{
			sub(wr(1, 0, 8), 1), sub(rd(2, 4, 5)), sub(rd(3, 8, 9), 3),
			done(1, 2),
		}},
		{"read does not overtake a waiting earlier write", []step{
			sub(wr(1, 0, 8), 1), sub(wr(2, 0, 8)), sub(rd(3, 0, 8)),
			done(1, 2), done(2, 3),
		}},
		{"flush waits for earlier writes and later writes wait for flush", []step{
			sub(wr(1, 0, 8), 1), sub(wr(2, 50, 58), 2), sub(fl(3)), sub(wr(4, 90, 91)), sub(rd(5, 90, 91)),
			done(2), done(1, 3), done(3, 4), done(4, 5),
		}},
		{"read runs alongside a flush", []step{
			sub(fl(1), 1), sub(rd(2, 0, 8), 2), done(2), done(1),
		}},
		{"meta waits for flush", []step{
			sub(fl(1), 1), sub(meta(2)), sub(rd(3, 0, 1), 3), done(1, 2),
		}},
		{"dependency chain through a failed or slow job", []step{
			sub(wr(1, 0, 1), 1), sub(wr(2, 10, 11, 1)), sub(wr(3, 20, 21, 2)),
			done(1, 2), done(2, 3), done(3),
		}},
		{"dependency on itself or a later job is ignored, not a deadlock", []step{
			sub(wr(1, 0, 8), 1), sub(wr(2, 0, 8, 2, 3)), sub(wr(3, 0, 8, 99)),
			done(1, 2), done(2, 3), done(3),
		}},
	}
	for _, sc := range scripts {
		t.Run(sc.name, func(t *testing.T) {
			e := newEngine()
			for i, st := range sc.steps {
				var got []wire.JobID
				if st.submit != nil {
					run, ok := e.submit(*st.submit)
					if !ok {
						t.Fatalf("step %d: submit %d refused", i, st.submit.id)
					}
					if run {
						got = []wire.JobID{st.submit.id}
					}
				} else {
					got = slices.Clone(e.complete(st.complete))
				}
				if !slices.Equal(got, st.want) {
					t.Fatalf("step %d: started %v, want %v", i, got, st.want)
				}
			}
		})
	}
}

func TestEngineRefusesDuplicatePendingID(t *testing.T) {
	e := newEngine()
	if _, ok := e.submit(wr(1, 0, 1)); !ok {
		t.Fatal("first submit refused")
	}
	if _, ok := e.submit(rd(1, 5, 6)); ok {
		t.Fatal("duplicate pending job ID accepted")
	}
	if e.len() != 1 {
		t.Fatalf("len = %d", e.len())
	}
}

func TestEngineDropKeepsRunningJobs(t *testing.T) {
	e := newEngine()
	e.submit(wr(1, 0, 1))
	e.submit(wr(2, 0, 1))
	e.submit(rd(3, 0, 1))
	if got := e.drop(); !slices.Equal(got, []wire.JobID{2, 3}) {
		t.Fatalf("dropped %v", got)
	}
	if got := e.complete(1); len(got) != 0 || e.len() != 0 {
		t.Fatalf("after drop, complete started %v, len %d", got, e.len())
	}
}

// TestEngineRandomScheduleIsSerializable runs seeded random workloads and
// checks the safety property directly: no two conflicting jobs ever run at
// once, a job never runs before its dependencies, and every job finishes.
func TestEngineRandomScheduleIsSerializable(t *testing.T) {
	for seed := uint64(1); seed <= 50; seed++ {
		rng := seed
		next := func(n uint64) uint64 {
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			return rng % n
		}
		e := newEngine()
		keys := map[wire.JobID]jobKey{}
		running := map[wire.JobID]bool{}
		finished := map[wire.JobID]bool{}
		start := func(id wire.JobID) {
			k := keys[id]
			for _, d := range k.deps {
				if !finished[d] {
					t.Fatalf("seed %d: job %d started before dep %d", seed, id, d)
				}
			}
			for r := range running {
				o := keys[r]
				if conflicts(&o, &k) {
					t.Fatalf("seed %d: job %d started while conflicting %d runs", seed, id, r)
				}
			}
			running[id] = true
		}
		id := wire.JobID(0)
		for range 400 {
			if next(3) > 0 || len(running) == 0 {
				id++
				first := next(64)
				var k jobKey
				switch next(5) {
				case 0:
					k = fl(id)
				case 1, 2:
					k = wr(id, first, first+1+next(8))
				default:
					k = rd(id, first, first+1+next(8))
				}
				if id > 1 && next(2) == 0 {
					k.deps = []wire.JobID{id - 1 - wire.JobID(next(uint64(min(id-1, 5))))}
				}
				keys[id] = k
				if run, _ := e.submit(k); run {
					start(id)
				}
				continue
			}
			var ids []wire.JobID
			for r := range running {
				ids = append(ids, r)
			}
			slices.Sort(ids)
			victim := ids[next(uint64(len(ids)))]
			delete(running, victim)
			finished[victim] = true
			for _, r := range e.complete(victim) {
				start(r)
			}
		}
		for len(running) > 0 {
			for r := range running {
				delete(running, r)
				finished[r] = true
				for _, s := range e.complete(r) {
					start(s)
				}
				break
			}
		}
		if e.len() != 0 {
			t.Fatalf("seed %d: %d jobs never ran", seed, e.len())
		}
	}
}
