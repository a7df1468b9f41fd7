package chaos

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestImpairmentValidateNamesEveryProblem(t *testing.T) {
	bad := Impairment{Loss: 1.5, Duplicate: math.NaN(), Reorder: -0.1, Delay: -time.Second}
	err := bad.Validate()
	if !errors.Is(err, ErrInvalidImpairment) {
		t.Fatalf("Validate = %v, want ErrInvalidImpairment", err)
	}
	for _, want := range []string{"loss", "duplicate", "reorder", "negative delay"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if err := (Impairment{Delay: MaxDelay, Jitter: 1}).Validate(); err == nil {
		t.Error("a delay past MaxDelay validated")
	}
	if err := (Impairment{Delay: 20 * time.Millisecond, Loss: 0.01}).Validate(); err != nil {
		t.Errorf("20 ms and 1%% loss: %v", err)
	}
}

func TestZeroImpairmentForwardsEverythingAtOnce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 1000 {
		if v := (Impairment{}).Decide(r); v.Copies != 1 || v.Delays[0] != 0 {
			t.Fatalf("zero impairment gave %+v", v)
		}
	}
}

// TestDecideRatesFollowTheProbabilities draws many verdicts with a fixed
// seed and checks the observed rates are near the configured ones.
func TestDecideRatesFollowTheProbabilities(t *testing.T) {
	imp := Impairment{Delay: 20 * time.Millisecond, Jitter: 5 * time.Millisecond,
		Loss: 0.01, Duplicate: 0.02, Reorder: 0.05, ReorderDelay: 10 * time.Millisecond}
	r := rand.New(rand.NewPCG(7, 7))
	const n = 200_000
	var dropped, duplicated, reordered int
	for range n {
		v := imp.Decide(r)
		switch v.Copies {
		case 0:
			dropped++
		case 2:
			duplicated++
		}
		if v.Copies > 0 && v.Delays[0] >= imp.Delay+imp.ReorderDelay {
			reordered++
		}
	}
	near := func(name string, got int, p float64) {
		rate := float64(got) / n
		if math.Abs(rate-p) > p/4 {
			t.Errorf("%s rate %.4f, want about %.4f", name, rate, p)
		}
	}
	near("loss", dropped, 0.01)
	near("duplicate", duplicated, 0.02*0.99)
	near("reorder", reordered, 0.05*0.99)
}

// FuzzImpairmentDecide checks, for any valid impairment and seed, that a
// verdict sends at most two copies, none when loss is certain, at least
// one when loss is impossible, each within the configured delays.
func FuzzImpairmentDecide(f *testing.F) {
	f.Add(int64(20e6), int64(0), 0.01, 0.0, 0.0, int64(0), uint64(1))
	f.Add(int64(0), int64(5e6), 1.0, 1.0, 1.0, int64(1e6), uint64(2))
	f.Add(int64(1e6), int64(1e6), 0.0, 0.5, 0.5, int64(3e6), uint64(3))
	f.Fuzz(func(t *testing.T, delay, jitter int64, loss, dup, reorder float64, reorderDelay int64, seed uint64) {
		imp := Impairment{Delay: time.Duration(delay), Jitter: time.Duration(jitter), Loss: loss,
			Duplicate: dup, Reorder: reorder, ReorderDelay: time.Duration(reorderDelay)}
		if imp.Validate() != nil {
			return
		}
		r := rand.New(rand.NewPCG(seed, seed^0x5bd1e995))
		for range 64 {
			v := imp.Decide(r)
			if v.Copies < 0 || v.Copies > 2 {
				t.Fatalf("%d copies", v.Copies)
			}
			if loss == 1 && v.Copies != 0 {
				t.Fatalf("certain loss forwarded %d copies", v.Copies)
			}
			if loss == 0 && v.Copies == 0 {
				t.Fatal("impossible loss dropped a datagram")
			}
			for i := range v.Copies {
				d := v.Delays[i]
				if d < imp.Delay || d > imp.Delay+imp.Jitter+imp.ReorderDelay {
					t.Fatalf("copy %d delayed %v, outside [%v, %v]", i, d, imp.Delay, imp.Delay+imp.Jitter+imp.ReorderDelay)
				}
			}
		}
	})
}
