package chaos

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// MaxDelay bounds every delay an Impairment may add to a packet, so a
// misconfigured proxy cannot hold packets (and their buffers) for long.
const MaxDelay = 5 * time.Second

// Impairment is what a link does to each UDP datagram crossing it, one
// direction at a time. The zero value forwards everything at once.
type Impairment struct {
	// Delay is added to every datagram; Jitter adds up to that much more,
	// uniformly, per datagram (which reorders them as a side effect).
	Delay  time.Duration
	Jitter time.Duration
	// Loss is the probability a datagram is dropped.
	Loss float64
	// Duplicate is the probability a forwarded datagram is sent twice,
	// the copy after its own delay.
	Duplicate float64
	// Reorder is the probability a datagram is held ReorderDelay longer,
	// so datagrams sent after it overtake it.
	Reorder      float64
	ReorderDelay time.Duration
}

// ErrInvalidImpairment is wrapped by Validate's errors.
var ErrInvalidImpairment = errors.New("invalid impairment")

// Validate reports every field out of range at once.
func (imp Impairment) Validate() error {
	var errs []error
	prob := func(name string, p float64) {
		if !(p >= 0 && p <= 1) { // also catches NaN
			errs = append(errs, fmt.Errorf("%w: %s %v is not a probability", ErrInvalidImpairment, name, p))
		}
	}
	prob("loss", imp.Loss)
	prob("duplicate", imp.Duplicate)
	prob("reorder", imp.Reorder)
	if imp.Delay < 0 || imp.Jitter < 0 || imp.ReorderDelay < 0 {
		errs = append(errs, fmt.Errorf("%w: negative delay", ErrInvalidImpairment))
	} else if imp.Delay+imp.Jitter+imp.ReorderDelay > MaxDelay {
		errs = append(errs, fmt.Errorf("%w: delay %v + jitter %v + reorder delay %v exceeds %v",
			ErrInvalidImpairment, imp.Delay, imp.Jitter, imp.ReorderDelay, MaxDelay))
	}
	return errors.Join(errs...)
}

// Verdict is what happens to one datagram: it is sent once per entry of
// Delays (none when dropped), each copy after that delay.
type Verdict struct {
	Copies int
	Delays [2]time.Duration
}

// Decide draws the fate of one datagram from r. It is the proxy's whole
// policy: pure, so tests and the fuzzer check it without sockets. imp
// must be valid.
func (imp Impairment) Decide(r *rand.Rand) Verdict {
	if imp.Loss > 0 && r.Float64() < imp.Loss {
		return Verdict{}
	}
	v := Verdict{Copies: 1}
	if imp.Duplicate > 0 && r.Float64() < imp.Duplicate {
		v.Copies = 2
	}
	for i := range v.Copies {
		d := imp.Delay
		if imp.Jitter > 0 {
			d += time.Duration(r.Int64N(int64(imp.Jitter) + 1))
		}
		if imp.Reorder > 0 && r.Float64() < imp.Reorder {
			d += imp.ReorderDelay
		}
		v.Delays[i] = d
	}
	return v
}
