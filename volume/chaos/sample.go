package chaos

import (
	"bufio"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Sample is one reading of a process's resources during a soak.
type Sample struct {
	At time.Duration // since the soak started
	// Goroutines, FDs, UDPSockets and RSSBytes are this process's (the
	// upstairs side): UDPSockets counts its open UDP sockets, one per QUIC
	// connection dialled. The Downstairs fields sum the running replica
	// processes' open fds and resident memory.
	Goroutines      int
	FDs, UDPSockets int
	RSSBytes        int64
	DownstairsFDs   int
	DownstairsRSS   int64
}

// TakeSample reads this process's figures and those of the pids given.
func TakeSample(start time.Time, downstairs []int) (Sample, error) {
	s := Sample{At: time.Since(start), Goroutines: runtime.NumGoroutine()}
	var err error
	if s.FDs, s.UDPSockets, err = countFDs("self", true); err != nil {
		return s, err
	}
	if s.RSSBytes, err = rss("self"); err != nil {
		return s, err
	}
	for _, pid := range downstairs {
		p := strconv.Itoa(pid)
		n, _, err := countFDs(p, false)
		if err != nil {
			continue // it may have exited since; a sample is a snapshot
		}
		r, err := rss(p)
		if err != nil {
			continue
		}
		s.DownstairsFDs += n
		s.DownstairsRSS += r
	}
	return s, nil
}

// countFDs counts pid's open fds and, if udp, those that are UDP sockets
// (their inodes listed in the process's /proc/<pid>/net/udp and udp6).
func countFDs(pid string, udp bool) (fds, udpSockets int, err error) {
	dir := "/proc/" + pid + "/fd"
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("reading %s: %w", dir, err)
	}
	if !udp {
		return len(ents), 0, nil
	}
	inodes := map[string]bool{}
	for _, f := range []string{"udp", "udp6"} {
		if err := udpInodes("/proc/"+pid+"/net/"+f, inodes); err != nil {
			return 0, 0, err
		}
	}
	for _, e := range ents {
		link, err := os.Readlink(dir + "/" + e.Name())
		if err != nil {
			continue // closed since ReadDir
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(ino, "]")] {
			udpSockets++
		}
	}
	return len(ents), udpSockets, nil
}

func udpInodes(path string, into map[string]bool) error {
	f, err := os.Open(path)
	if err != nil {
		if os.IsNotExist(err) {
			return nil // no IPv6
		}
		return fmt.Errorf("reading UDP sockets: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) > 9 {
			into[fields[9]] = true
		}
	}
	return sc.Err()
}

// rss is pid's resident set size from /proc/<pid>/status.
func rss(pid string) (int64, error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, fmt.Errorf("reading status of %s: %w", pid, err)
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("parsing VmRSS of %s: %w", pid, err)
			}
			return kb << 10, nil
		}
	}
	return 0, fmt.Errorf("reading status of %s: no VmRSS", pid)
}

// Trend is a least-squares line through one figure of a soak's samples.
type Trend struct {
	First, Last float64
	// PerMinute is the slope; FirstThirdMax and LastThirdMax the largest
	// value in the first and last third of the samples.
	PerMinute                   float64
	FirstThirdMax, LastThirdMax float64
}

// TrendOf fits a line through value over samples.
func TrendOf(samples []Sample, value func(Sample) float64) Trend {
	var t Trend
	n := len(samples)
	if n == 0 {
		return t
	}
	t.First, t.Last = value(samples[0]), value(samples[n-1])
	var sx, sy, sxx, sxy float64
	for _, s := range samples {
		x, y := s.At.Minutes(), value(s)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
	}
	if d := float64(n)*sxx - sx*sx; d > 0 {
		t.PerMinute = (float64(n)*sxy - sx*sy) / d
	}
	third := max(1, n/3)
	for i, s := range samples {
		v := value(s)
		if i < third {
			t.FirstThirdMax = max(t.FirstThirdMax, v)
		}
		if i >= n-third {
			t.LastThirdMax = max(t.LastThirdMax, v)
		}
	}
	return t
}

// Bounded says the figure did not grow past the first third's peak by
// more than slack plus half of that peak in the last third: a leak grows
// with every iteration, steady use plateaus.
func (t Trend) Bounded(slack float64) bool {
	return t.LastThirdMax <= t.FirstThirdMax*1.5+slack
}
