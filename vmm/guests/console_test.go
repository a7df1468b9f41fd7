package guests

import (
	"reflect"
	"testing"
	"time"
)

func TestParseDirtyVerify(t *testing.T) {
	for _, c := range []struct {
		line string
		want DirtyVerify
		ok   bool
	}{
		{"dirty: verify PASS generation 42", DirtyVerify{Pass: true, Generation: 42}, true},
		{"dirty: verify FAIL page 7 want generation 4 found 3", DirtyVerify{Detail: "page 7 want generation 4 found 3"}, true},
		{"dirty: verify PASS generation x", DirtyVerify{Pass: true}, false},
		{"dirty: verified 256 MiB in 12 ms", DirtyVerify{}, false},
		{"", DirtyVerify{}, false},
	} {
		got, ok := ParseDirtyVerify(c.line)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseDirtyVerify(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestParseDirtyRate(t *testing.T) {
	for _, c := range []struct {
		line string
		want uint64
		ok   bool
	}{
		{"dirty: rate 15126 MiB/s", 15126, true},
		{"dirty: rate 0 MiB/s", 0, true},
		{"dirty: rate 12 GiB/s", 0, false},
		{"dirty: rate MiB/s", 0, false},
		{"dirty: filled 256 MiB in 40 ms", 0, false},
	} {
		got, ok := ParseDirtyRate(c.line)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseDirtyRate(%q) = %d, %v; want %d, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestParseDirtyGap(t *testing.T) {
	for _, c := range []struct {
		line string
		want time.Duration
		ok   bool
	}{
		{"dirty: progress gap 1234 us", 1234 * time.Microsecond, true},
		{"dirty: progress gap 0 us", 0, true},
		{"dirty: progress gap -5 us", 0, false},
		{"dirty: progress gap 99999999999999999 us", 0, false},
		{"dirty: progress gap 12 ms", 0, false},
		{"dirty: max progress gap 3 tsc ticks", 0, false},
	} {
		got, ok := ParseDirtyGap(c.line)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseDirtyGap(%q) = %v, %v; want %v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestParseDirtyLargestGap(t *testing.T) {
	for _, c := range []struct {
		line string
		want time.Duration
		ok   bool
	}{
		{"dirty: largest gap 412 us", 412 * time.Microsecond, true},
		{"dirty: largest gap 0 us", 0, true},
		{"dirty: largest gap -5 us", 0, false},
		{"dirty: largest gap 99999999999999999 us", 0, false},
		{"dirty: progress gap 412 us", 0, false},
	} {
		got, ok := ParseDirtyLargestGap(c.line)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseDirtyLargestGap(%q) = %v, %v; want %v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestParseDemoReady(t *testing.T) {
	for _, c := range []struct {
		line string
		want DemoReady
		ok   bool
	}{
		{"demo: ready, disk 2048 sectors", DemoReady{Disk: true, Sectors: 2048}, true},
		{"demo: ready, no disk", DemoReady{}, true},
		{"demo: ready, disk x sectors", DemoReady{Disk: true}, false},
		{"demo: ready, disk 2048", DemoReady{}, false},
		{"demo: no disk", DemoReady{}, false},
		{"echo: ready", DemoReady{}, false},
	} {
		got, ok := ParseDemoReady(c.line)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseDemoReady(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestParseDemoRound(t *testing.T) {
	for _, c := range []struct {
		line string
		want DemoRound
		ok   bool
	}{
		{"demo: round 7 wrote 4 sectors, verified 4, ok", DemoRound{Round: 7, OK: true, Wrote: 4, Verified: 4}, true},
		{"demo: round 1 no disk", DemoRound{Round: 1, NoDisk: true}, true},
		{"demo: round 3 FAIL sector 17", DemoRound{Round: 3, Detail: "sector 17"}, true},
		{"demo: round 3 FAIL flush request", DemoRound{Round: 3, Detail: "flush request"}, true},
		{"demo: round 3 FAIL ", DemoRound{}, false},
		{"demo: round x no disk", DemoRound{}, false},
		{"demo: round 2 wrote 4 sectors, verified 4", DemoRound{}, false},
		{"demo: round 2 wrote four sectors, verified 4, ok", DemoRound{}, false},
		{"demo: round 2", DemoRound{}, false},
		{"demo: echo round 2 no disk", DemoRound{}, false},
	} {
		got, ok := ParseDemoRound(c.line)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseDemoRound(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestParseDemoEcho(t *testing.T) {
	for _, c := range []struct {
		line, want string
		ok         bool
	}{
		{"demo: echo hello tern", "hello tern", true},
		{"demo: echo ", "", true},
		{"demo: echo quit", DemoQuit, true},
		{"echo: hello", "", false},
		{"demo: bye", "", false},
	} {
		got, ok := ParseDemoEcho(c.line)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseDemoEcho(%q) = %q, %v; want %q, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

func TestParseUDPReport(t *testing.T) {
	r, err := ParseUDPReport([]string{
		"udp: received 12 distinct 10 first 3 highest 14 gap_us 2500 after 9 until 12 stall_us 2100 marked_stall_us 4100 marked_gap_us 5200 marked_after 10 marked_until 13",
		"udp: missing 10-11", "udp: end"})
	want := UDPReport{Received: 12, Distinct: 10, First: 3, Highest: 14, Gap: 2500 * time.Microsecond,
		GapAfter: 9, GapUntil: 12, Stall: 2100 * time.Microsecond,
		MarkedStall: 4100 * time.Microsecond, MarkedGap: 5200 * time.Microsecond, MarkedAfter: 10, MarkedUntil: 13, Missing: [][2]uint64{{10, 11}}}
	if err != nil || !reflect.DeepEqual(r, want) {
		t.Fatalf("ParseUDPReport = %+v, %v; want %+v", r, err, want)
	}
	if r.Lost() != 2 {
		t.Errorf("Lost() = %d; want 2 (12 numbers from 3 to 14, 10 distinct)", r.Lost())
	}
	r, err = ParseUDPReport([]string{
		"udp: received 0 distinct 0 first 0 highest 0 gap_us 0 after 0 until 0 stall_us 0 marked_stall_us 0 marked_gap_us 0 marked_after 0 marked_until 0", "udp: missing 1-1", "udp: missing more", "udp: end"})
	if err != nil || !r.More || len(r.Missing) != 1 {
		t.Errorf("ParseUDPReport with more = %+v, %v", r, err)
	}
	first := "udp: received 12 distinct 10 first 3 highest 14 gap_us 2500 after 9 until 12 stall_us 2100 marked_stall_us 4100 marked_gap_us 5200 marked_after 10 marked_until 13"
	for _, bad := range [][]string{
		{first},
		{"udp: ready mac 52:54:00:00:00:01", "udp: end"},
		{"udp: received 12 distinct 10 first 3 highest 14 gap_us 2500 after 9 until 12", "udp: end"},
		{"udp: received 12 distinct 10 first 3 highest 14 gap_us 2500 after 9 until 12 stall_us 2100", "udp: end"},
		{"udp: received 12 distinct x first 3 highest 14 gap_us 2500 after 9 until 12 stall_us 1 marked_stall_us 0 marked_gap_us 0 marked_after 0 marked_until 0", "udp: end"},
		{"udp: received 12 unique 10 first 3 highest 14 gap_us 2500 after 9 until 12 stall_us 1 marked_stall_us 0 marked_gap_us 0 marked_after 0 marked_until 0", "udp: end"},
		{first, "udp: missing 7-5", "udp: end"},
		{first, "udp: missing 7", "udp: end"},
		{first, "udp: missing more", "udp: missing 1-2", "udp: end"},
		{first, "udp: gone 1-2", "udp: end"},
	} {
		if _, err := ParseUDPReport(bad); err == nil {
			t.Errorf("ParseUDPReport(%q) accepted it", bad)
		}
	}
}
