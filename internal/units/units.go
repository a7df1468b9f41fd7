package units

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Binary multiples.
const (
	KiB uint64 = 1 << 10
	MiB uint64 = 1 << 20
	GiB uint64 = 1 << 30
	TiB uint64 = 1 << 40
)

var suffixes = []struct {
	name string
	mult uint64
}{
	{"TiB", TiB}, {"GiB", GiB}, {"MiB", MiB}, {"KiB", KiB}, {"B", 1},
}

// ErrBadSize is wrapped by every ParseBytes error.
var ErrBadSize = errors.New("invalid size")

// ParseBytes parses a byte count: digits, optionally followed by B, KiB,
// MiB, GiB or TiB (case-sensitive, as written by FormatBytes).
func ParseBytes(s string) (uint64, error) {
	t := strings.TrimSpace(s)
	mult := uint64(1)
	for _, suf := range suffixes {
		if strings.HasSuffix(t, suf.name) {
			t, mult = strings.TrimSpace(strings.TrimSuffix(t, suf.name)), suf.mult
			break
		}
	}
	if t == "" || strings.ContainsAny(t, "+-") {
		return 0, fmt.Errorf("%w %q: want a byte count such as 4096, 64MiB or 1GiB", ErrBadSize, s)
	}
	n, err := strconv.ParseUint(t, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w %q: want a byte count such as 4096, 64MiB or 1GiB", ErrBadSize, s)
	}
	if n > math.MaxUint64/mult {
		return 0, fmt.Errorf("%w %q: too large", ErrBadSize, s)
	}
	return n * mult, nil
}

// FormatBytes writes n with the largest binary suffix that divides it
// exactly ("64MiB", "4KiB"), or in bytes with a B suffix when none does
// ("4100B", "0B"), so ParseBytes(FormatBytes(n)) == n. It is the one way
// tern writes a size in a message; Bytes' String uses it.
func FormatBytes(n uint64) string {
	for _, suf := range suffixes[:4] {
		if n != 0 && n%suf.mult == 0 {
			return strconv.FormatUint(n/suf.mult, 10) + suf.name
		}
	}
	return strconv.FormatUint(n, 10) + "B"
}

// Bytes is a byte count usable as a command-line flag (it implements
// pflag.Value and flag.Value).
type Bytes uint64

// String formats b with FormatBytes, so a Bytes prints the same way in a
// message (fmt's %v or %s) as in a flag's help.
func (b Bytes) String() string { return FormatBytes(uint64(b)) }

// Set parses s with ParseBytes.
func (b *Bytes) Set(s string) error {
	n, err := ParseBytes(s)
	if err != nil {
		return err
	}
	*b = Bytes(n)
	return nil
}

// Type names the flag's value kind in help output.
func (b *Bytes) Type() string { return "size" }
