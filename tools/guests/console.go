package guests

import (
	"strconv"
	"strings"
)

// Lines the guests print on their serial console (without the CR LF), for
// hosts and tests that watch it.
const (
	// HelloLine is hello's one line.
	HelloLine = "Hello from the tern test guest"
	// EchoReady is echo's first line: from then on it reads input.
	EchoReady = "echo: ready"
	// EchoBye is echo's last line, after it echoed "quit".
	EchoBye = "echo: bye"
	// ExceptionPrefix starts the line a guest prints for an exception.
	ExceptionPrefix = "guest: exception "
)

// DirtyVerify is the result of one of the dirty guest's verifications.
type DirtyVerify struct {
	// Pass reports "dirty: verify PASS generation N".
	Pass bool
	// Generation is N of a PASS line.
	Generation uint64
	// Detail is what follows "dirty: verify FAIL " (the page, the
	// generation it should hold and the one it holds).
	Detail string
}

// ParseDirtyVerify parses "dirty: verify PASS generation N" or
// "dirty: verify FAIL ...". ok is false for any other line.
func ParseDirtyVerify(line string) (v DirtyVerify, ok bool) {
	if rest, found := strings.CutPrefix(line, "dirty: verify PASS generation "); found {
		gen, err := strconv.ParseUint(rest, 10, 64)
		return DirtyVerify{Pass: true, Generation: gen}, err == nil
	}
	if rest, found := strings.CutPrefix(line, "dirty: verify FAIL "); found {
		return DirtyVerify{Detail: rest}, true
	}
	return DirtyVerify{}, false
}

// ParseDirtyRate returns N of "dirty: rate N MiB/s", the distinct pages
// the dirty guest dirtied per second since its last rate line (scaled by
// Params.TSCkHz). ok is false for any other line.
func ParseDirtyRate(line string) (mibPerSec uint64, ok bool) {
	rest, found := strings.CutPrefix(line, "dirty: rate ")
	if !found {
		return 0, false
	}
	n, found := strings.CutSuffix(rest, " MiB/s")
	if !found {
		return 0, false
	}
	v, err := strconv.ParseUint(n, 10, 64)
	return v, err == nil
}
