package upstairs

import "testing"

func TestPatternIsPerBlockAndDetectsDamage(t *testing.T) {
	a := make([]byte, 4*512)
	FillPattern(a, 512, 10, 1)
	b := make([]byte, 512)
	FillPattern(b, 512, 12, 1) // block 12 computed on its own
	if string(a[2*512:3*512]) != string(b) {
		t.Fatal("block differs when computed alone")
	}
	c := make([]byte, 512)
	FillPattern(c, 512, 12, 2)
	if string(c) == string(b) {
		t.Fatal("seed does not change the data")
	}
	if _, bad := CheckPattern(a, 512, 10, 1, nil); bad {
		t.Fatal("pattern does not check against itself")
	}
	a[3*512+7] ^= 1
	if idx, bad := CheckPattern(a, 512, 10, 1, nil); !bad || idx != 13 {
		t.Fatalf("CheckPattern = %d, %v; want block 13", idx, bad)
	}
}
