package main

import (
	"path/filepath"
	"strings"
	"testing"

	"tern/volume/extent"
	"tern/volume/volumetest"
)

// startVolume serves three 8 MiB replicas (4 extents of 2 MiB) in-process
// and returns the --targets and --certs arguments for them.
func startVolume(t *testing.T) []string {
	t.Helper()
	dir := t.TempDir()
	c, err := volumetest.NewCluster(dir, extent.NewSpec(4096, 512, 4))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.StartAll(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return []string{"--targets", strings.Join(c.Targets(), ","), "--certs", filepath.Join(dir, "certs"), "--log-level", "warn"}
}

func TestVolumeFillThenVerify(t *testing.T) {
	vol := startVolume(t)
	out, errOut, code := runTern(t, append([]string{"volume", "fill", "--gen", "1", "--seed", "42"}, vol...)...)
	if code != 0 {
		t.Fatalf("fill exited %d: %s", code, errOut)
	}
	if !strings.Contains(out, "filled 8MiB at offset 0B") {
		t.Fatalf("fill printed %q", out)
	}
	// Overwrite 8 KiB in the middle with another seed.
	if _, errOut, code := runTern(t, append([]string{"volume", "fill", "--gen", "2", "--seed", "7", "--offset", "4MiB", "--length", "8KiB"}, vol...)...); code != 0 {
		t.Fatalf("partial fill exited %d: %s", code, errOut)
	}
	tests := []struct {
		args    []string
		wantErr string // empty: must succeed
	}{
		{[]string{"--gen", "3", "--seed", "42", "--length", "4MiB"}, ""},
		{[]string{"--gen", "4", "--seed", "7", "--offset", "4MiB", "--length", "8KiB"}, ""},
		{[]string{"--gen", "5", "--seed", "42"}, "block 1024: "},
		// Inputs that are wrong on this volume fail before activating,
		// so they use up no generation: 6 is still free after them.
		{[]string{"--gen", "6", "--seed", "42", "--offset", "4100", "--length", "4KiB"}, "--offset 4100B: not block-aligned on any volume"},
		{[]string{"--gen", "6", "--seed", "42", "--offset", "2KiB", "--length", "4KiB"}, "--offset 2KiB: not a multiple of the 4KiB block size"},
		{[]string{"--gen", "6", "--seed", "42", "--offset", "300MiB"}, "--offset 300MiB: past the end of the 8MiB volume"},
		{[]string{"--gen", "6", "--seed", "42", "--offset", "7MiB", "--length", "2MiB"}, "--offset 7MiB, --length 2MiB: past the end of the 8MiB volume"},
		{[]string{"--gen", "6", "--seed", "42", "--length", "0"}, "--length 0B: the range is empty"},
		{[]string{"--gen", "6", "--seed", "42", "--length", "4MiB"}, ""},
		{[]string{"--gen", "6", "--seed", "42"}, "generation too low"}, // gen 6 used by the previous run
	}
	for _, tt := range tests {
		_, errOut, code := runTern(t, append(append([]string{"volume", "verify"}, tt.args...), vol...)...)
		switch {
		case tt.wantErr == "" && code != 0:
			t.Errorf("verify %v exited %d: %s", tt.args, code, errOut)
		case tt.wantErr != "" && (code == 0 || !strings.Contains(errOut, tt.wantErr)):
			t.Errorf("verify %v exited %d with %q, want failure naming %q", tt.args, code, errOut, tt.wantErr)
		}
	}
}

func TestVolumeFillRequiresTargetsCertsGen(t *testing.T) {
	_, errOut, code := runTern(t, "volume", "fill", "--seed", "1")
	if code == 0 {
		t.Fatal("fill without --targets, --certs and --gen succeeded")
	}
	for _, flag := range []string{"targets", "certs", "gen"} {
		if !strings.Contains(errOut, flag) {
			t.Errorf("error %q does not name --%s", errOut, flag)
		}
	}
}
