package layout

import (
	"errors"
	"testing"

	"tern/volume/ec"
)

func TestParseReadsBackWhatStringWrites(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		shards   int
	}{
		{"", "replicated", 3},
		{"replicated", "replicated", 3},
		{"ec:4+2", "ec:4+2", 6},
		{"ec:2+1", "ec:2+1", 3},
	} {
		l, err := Parse(tc.in)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.in, err)
		}
		if l.String() != tc.want || l.Downstairs() != tc.shards {
			t.Errorf("Parse(%q) = %v with %d downstairs, want %s with %d", tc.in, l, l.Downstairs(), tc.want, tc.shards)
		}
		if back, err := Parse(l.String()); err != nil || back != l {
			t.Errorf("Parse(%q) = %v, %v; want %v", l.String(), back, err, l)
		}
	}
}

func TestParseRefusesWhatIsNoLayout(t *testing.T) {
	for _, in := range []string{"mirror", "ec:9+2", "ec:4+0", "ec:"} {
		if _, err := Parse(in); !errors.Is(err, ec.ErrInvalidLayout) {
			t.Errorf("Parse(%q) = %v, want ec.ErrInvalidLayout", in, err)
		}
	}
}
