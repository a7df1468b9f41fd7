package units

import (
	"errors"
	"fmt"
	"testing"
)

func TestParseBytesAcceptsPlainAndBinarySuffixes(t *testing.T) {
	for in, want := range map[string]uint64{
		"0": 0, "4096": 4096, "512B": 512, "1KiB": 1024, "64MiB": 64 << 20,
		"1GiB": 1 << 30, "2TiB": 2 << 40, " 8 MiB ": 8 << 20,
	} {
		got, err := ParseBytes(in)
		if err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
}

func TestParseBytesRejectsGarbage(t *testing.T) {
	for _, in := range []string{"", "MiB", "-1", "+5", "1.5GiB", "64mb", "12XB", "99999999999TiB", "18446744073709551616"} {
		if n, err := ParseBytes(in); !errors.Is(err, ErrBadSize) {
			t.Errorf("ParseBytes(%q) = %d, %v; want ErrBadSize", in, n, err)
		}
	}
}

func TestFormatBytesRoundTrips(t *testing.T) {
	for _, n := range []uint64{0, 1, 511, 4096, 64 << 20, 3 << 30, 1<<40 + 1} {
		got, err := ParseBytes(FormatBytes(n))
		if err != nil || got != n {
			t.Errorf("round trip of %d via %q = %d, %v", n, FormatBytes(n), got, err)
		}
	}
	for n, want := range map[uint64]string{
		64 << 20: "64MiB", 255 << 20: "255MiB", 2 << 20: "2MiB", 4096: "4KiB",
		4100: "4100B", 0: "0B", 1<<40 + 1: "1099511627777B",
	} {
		if s := FormatBytes(n); s != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", n, s, want)
		}
	}
}

func TestBytesFormatsInMessages(t *testing.T) {
	if s := fmt.Sprintf("%v of %s", Bytes(256<<20), Bytes(0)); s != "256MiB of 0B" {
		t.Fatalf("Bytes in a message: %q", s)
	}
}

func TestBytesFlagValue(t *testing.T) {
	var b Bytes
	if err := b.Set("64MiB"); err != nil || b != Bytes(64<<20) || b.String() != "64MiB" {
		t.Fatalf("Set(64MiB) -> %v, %d, %q", err, b, b.String())
	}
	if err := b.Set("lots"); err == nil {
		t.Fatal("Set(lots) succeeded")
	}
}
