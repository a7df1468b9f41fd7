package guests

import (
	"fmt"
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

// UDPEchoPort is the UDP port the udp guest echoes; it counts datagrams
// to any other port.
const UDPEchoPort = 7

// UDPMaxSeq bounds the sequence numbers the udp guest tells apart:
// datagrams numbered from it on are counted but not as distinct.
const UDPMaxSeq = 65536

// UDPReport is the udp guest's report, which it prints when the
// verify-request word changes (VerifyRequestOffset; it acknowledges at
// VerifyAckOffset as the dirty guest does): a line from
// UDPReportFirstLine, the missing runs, and UDPReportEnd.
type UDPReport struct {
	// Received counts the numbered datagrams that arrived, Distinct the
	// distinct numbers among them (below UDPMaxSeq).
	Received, Distinct uint64
	// First is the number of the first to arrive, Highest the highest.
	First, Highest uint64
	// Gap is the longest time between two arrivals, GapAfter the highest
	// number that had arrived when it began and GapUntil the number whose
	// arrival ended it.
	Gap                time.Duration
	GapAfter, GapUntil uint64
	// Stall is the longest time between two turns of the guest's polling
	// loop since the first arrival: the guest's measure of a migration's
	// downtime, or of its vCPU not being run.
	Stall time.Duration
	// MarkedStall is the stall of the pause in which the host changed the
	// mark word (MarkOffset): a migration's downtime as the guest saw it.
	// MarkedGap is the time between the arrivals on either side of that
	// pause, MarkedAfter the highest number that had arrived before it
	// (frames the card received before it, which the guest took in only
	// after, included) and MarkedUntil the number that ended it. All are 0 with no mark,
	// and the gap's with no arrival after it yet.
	MarkedStall, MarkedGap   time.Duration
	MarkedAfter, MarkedUntil uint64
	// Missing are the runs of numbers from First to Highest that never
	// arrived, each [from, to]; More says there were more runs than the
	// guest prints.
	Missing [][2]uint64
	More    bool
}

// Lost is how many numbers between First and Highest never arrived.
func (r UDPReport) Lost() uint64 {
	if r.Received == 0 {
		return 0
	}
	return r.Highest - r.First + 1 - r.Distinct
}

// The udp guest's report begins with a line that starts with
// UDPReportFirstLine and ends with the line UDPReportEnd.
const (
	UDPReportFirstLine = "udp: received "
	UDPReportEnd       = "udp: end"
)

// ParseUDPReport parses the lines of one report: "udp: received N
// distinct D first F highest H gap_us G after S until U stall_us T
// marked_stall_us MS marked_gap_us MG marked_after MA marked_until MU", any
// number of "udp: missing A-B", at most one "udp: missing more", and
// "udp: end".
func ParseUDPReport(lines []string) (UDPReport, error) {
	if len(lines) < 2 || lines[len(lines)-1] != UDPReportEnd {
		return UDPReport{}, fmt.Errorf("udp report %q: want a first line and %q last", lines, UDPReportEnd)
	}
	f := strings.Fields(strings.TrimPrefix(lines[0], "udp: "))
	keys := []string{"received", "distinct", "first", "highest", "gap_us", "after", "until", "stall_us",
		"marked_stall_us", "marked_gap_us", "marked_after", "marked_until"}
	if !strings.HasPrefix(lines[0], UDPReportFirstLine) || len(f) != 2*len(keys) {
		return UDPReport{}, fmt.Errorf("udp report line %q: want %s", lines[0], strings.Join(keys, " N "))
	}
	v := make([]uint64, len(keys))
	for i, k := range keys {
		n, err := strconv.ParseUint(f[2*i+1], 10, 64)
		if f[2*i] != k || err != nil {
			return UDPReport{}, fmt.Errorf("udp report line %q: field %d is not %s N", lines[0], i, k)
		}
		v[i] = n
	}
	r := UDPReport{Received: v[0], Distinct: v[1], First: v[2], Highest: v[3],
		Gap: time.Duration(v[4]) * time.Microsecond, GapAfter: v[5], GapUntil: v[6], Stall: time.Duration(v[7]) * time.Microsecond,
		MarkedStall: time.Duration(v[8]) * time.Microsecond, MarkedGap: time.Duration(v[9]) * time.Microsecond, MarkedAfter: v[10], MarkedUntil: v[11]}
	for _, l := range lines[1 : len(lines)-1] {
		run, ok := strings.CutPrefix(l, "udp: missing ")
		if !ok || r.More {
			return UDPReport{}, fmt.Errorf("udp report line %q: want udp: missing A-B, before any 'more'", l)
		}
		if run == "more" {
			r.More = true
			continue
		}
		a, b, _ := strings.Cut(run, "-")
		from, err1 := strconv.ParseUint(a, 10, 64)
		to, err2 := strconv.ParseUint(b, 10, 64)
		if err1 != nil || err2 != nil || to < from {
			return UDPReport{}, fmt.Errorf("udp report line %q: want udp: missing A-B with A <= B", l)
		}
		r.Missing = append(r.Missing, [2]uint64{from, to})
	}
	return r, nil
}
