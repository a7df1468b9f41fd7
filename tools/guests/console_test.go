package guests

import "testing"

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
