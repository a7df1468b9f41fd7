package main

import (
	"strings"
	"testing"
)

func TestNetFlagTakesATAPAndAnOptionalMAC(t *testing.T) {
	for _, c := range []struct {
		in      string
		tap     string
		mac     string // "" for none given
		wantErr string
	}{
		{in: "tap:tap0", tap: "tap0"},
		{in: "tap:vm7,mac=52:54:00:12:34:56", tap: "vm7", mac: "52:54:00:12:34:56"},
		{in: "tap0", wantErr: "want tap:NAME"},
		{in: "bridge:br0", wantErr: "want tap:NAME"},
		{in: "tap:", wantErr: "no TAP name"},
		{in: "tap:t,mac=zz", wantErr: "invalid MAC"},
		{in: "tap:t,mtu=9000", wantErr: `option "mtu=9000"`},
		{in: "tap:t,mac=52:54:00:12:34:56,mac=52:54:00:12:34:57", wantErr: "want one mac"},
	} {
		n, err := parseNetFlag(c.in)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q: error %v; want one saying %q", c.in, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", c.in, err)
			continue
		}
		if n.TAP != c.tap || (c.mac == "") != (n.MAC == nil) || c.mac != "" && n.MAC.String() != c.mac {
			t.Errorf("%q: got %+v; want tap %s mac %q", c.in, n, c.tap, c.mac)
		}
	}
	nics, err := parseNetFlags([]string{"tap:a", "tap:b"})
	if err != nil || len(nics) != 2 || nics[1].TAP != "b" {
		t.Errorf("two flags: %+v, %v", nics, err)
	}
	if _, err := parseNetFlags([]string{"x", "tap:"}); err == nil || strings.Count(err.Error(), "\n") != 1 {
		t.Errorf("two bad flags: %v; want both on their own lines", err)
	}
}
