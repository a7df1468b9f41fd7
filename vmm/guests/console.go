package guests

import (
	"math"
	"strconv"
	"strings"
	"time"
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

// DirtyGapReportAbove is the shortest progress gap a continuous dirty
// guest reports with a "dirty: progress gap N us" line.
const DirtyGapReportAbove = time.Millisecond

// ParseDirtyGap returns N of "dirty: progress gap N us", which a
// continuous dirty guest prints for every stretch of over
// DirtyGapReportAbove in which it did not run (a migration's downtime,
// or the host not scheduling its vCPU, also while the guest prints or
// verifies). ok is false for any other line.
func ParseDirtyGap(line string) (gap time.Duration, ok bool) {
	n, found := cutAround(line, "dirty: progress gap ", " us")
	if !found {
		return 0, false
	}
	v, err := strconv.ParseUint(n, 10, 64)
	if err != nil || v > uint64(math.MaxInt64/int64(time.Microsecond)) {
		return 0, false
	}
	return time.Duration(v) * time.Microsecond, true
}

// ParseDirtyLargestGap returns N of "dirty: largest gap N us", which a
// continuous dirty guest prints before each verification: the longest
// gap since its previous such line, however short (a migration's pause
// under DirtyGapReportAbove is seen with its value). ok is false for any
// other line.
func ParseDirtyLargestGap(line string) (gap time.Duration, ok bool) {
	n, found := cutAround(line, "dirty: largest gap ", " us")
	if !found {
		return 0, false
	}
	v, err := strconv.ParseUint(n, 10, 64)
	if err != nil || v > uint64(math.MaxInt64/int64(time.Microsecond)) {
		return 0, false
	}
	return time.Duration(v) * time.Microsecond, true
}

// Lines of the demo guest (src/demo.c), which stays running: see
// ParseDemoReady, ParseDemoRound and ParseDemoEcho for the lines that
// carry values.
const (
	// DemoNoDisk is demo's line when it found no virtio-blk device; it
	// goes on without one. A device that would not set up gives
	// DemoNoDisk + ": " + the reason.
	DemoNoDisk = "demo: no disk"
	// DemoReadyPrefix starts demo's ready line, "demo: ready, disk N
	// sectors" or "demo: ready, no disk": from then on it reads input.
	DemoReadyPrefix = "demo: ready, "
	// DemoEchoPrefix starts the line demo prints for each line it reads.
	DemoEchoPrefix = "demo: echo "
	// DemoQuit is the input line that makes demo say DemoBye and exit 0.
	DemoQuit = "quit"
	// DemoBye is demo's last line, after it echoed DemoQuit.
	DemoBye = "demo: bye"
)

// DemoReady is what demo's ready line says about its disk.
type DemoReady struct {
	// Disk reports a usable virtio-blk device.
	Disk bool
	// Sectors is the disk's capacity in 512-byte sectors.
	Sectors uint64
}

// ParseDemoReady parses "demo: ready, disk N sectors" or "demo: ready, no
// disk". ok is false for any other line.
func ParseDemoReady(line string) (r DemoReady, ok bool) {
	rest, found := strings.CutPrefix(line, DemoReadyPrefix)
	if !found {
		return DemoReady{}, false
	}
	if rest == "no disk" {
		return DemoReady{}, true
	}
	n, found := cutAround(rest, "disk ", " sectors")
	if !found {
		return DemoReady{}, false
	}
	v, err := strconv.ParseUint(n, 10, 64)
	return DemoReady{Disk: true, Sectors: v}, err == nil
}

// DemoRound is one of demo's once-a-second status lines.
type DemoRound struct {
	// Round is R, counting from 1.
	Round uint64
	// OK reports "demo: round R wrote W sectors, verified V, ok".
	OK bool
	// Wrote and Verified are W and V of an OK line.
	Wrote, Verified uint64
	// NoDisk reports "demo: round R no disk".
	NoDisk bool
	// Detail is what follows "demo: round R FAIL ": "sector S" for a
	// sector that read back wrong, or the request that failed ("write
	// request", "flush request", "read request").
	Detail string
}

// ParseDemoRound parses one of demo's status lines. ok is false for any
// other line.
func ParseDemoRound(line string) (r DemoRound, ok bool) {
	rest, found := strings.CutPrefix(line, "demo: round ")
	if !found {
		return DemoRound{}, false
	}
	n, rest, found := strings.Cut(rest, " ")
	if !found {
		return DemoRound{}, false
	}
	round, err := strconv.ParseUint(n, 10, 64)
	if err != nil {
		return DemoRound{}, false
	}
	r.Round = round
	if rest == "no disk" {
		r.NoDisk = true
		return r, true
	}
	if detail, found := strings.CutPrefix(rest, "FAIL "); found && detail != "" {
		r.Detail = detail
		return r, true
	}
	counts, found := cutAround(rest, "wrote ", ", ok")
	if !found {
		return DemoRound{}, false
	}
	wrote, verified, found := strings.Cut(counts, " sectors, verified ")
	if !found {
		return DemoRound{}, false
	}
	var errW, errV error
	r.Wrote, errW = strconv.ParseUint(wrote, 10, 64)
	r.Verified, errV = strconv.ParseUint(verified, 10, 64)
	if errW != nil || errV != nil {
		return DemoRound{}, false
	}
	r.OK = true
	return r, true
}

// ParseDemoEcho returns the input line demo echoed in "demo: echo
// <line>". ok is false for any other line.
func ParseDemoEcho(line string) (input string, ok bool) {
	if input, ok = strings.CutPrefix(line, DemoEchoPrefix); !ok {
		return "", false
	}
	return input, true
}

// cutAround returns s without prefix and suffix, when it has both.
func cutAround(s, prefix, suffix string) (string, bool) {
	rest, found := strings.CutPrefix(s, prefix)
	if !found {
		return "", false
	}
	return strings.CutSuffix(rest, suffix)
}
