package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVolumeScrubRewritesABitFlippedAtRest flips a bit in replica 1's
// extent file while its downstairs process is down; `tern volume scrub`
// finds the block and rewrites it from a peer, and a second scrub finds
// nothing left to rewrite.
func TestVolumeScrubRewritesABitFlippedAtRest(t *testing.T) {
	v := startVolumeProcesses(t)
	common := []string{"--targets", v.targetList(), "--certs", v.certs, "--activation-quorum-wait", "60s", "--log-level", "warn"}
	if _, errOut, code := runTern(t, append([]string{"volume", "fill", "--gen", "1", "--seed", "5", "--length", "1MiB"}, common...)...); code != 0 {
		t.Fatalf("fill exited %d: %s", code, errOut)
	}
	v.stop(t, 1)
	name := filepath.Join(v.dirs[1], "000000.ext")
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, 4096+100); err != nil { // block 1
		t.Fatal(err)
	}
	b[0] ^= 0x04
	if _, err := f.WriteAt(b, 4096+100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	v.start(t, 1)

	out, errOut, code := runTern(t, append([]string{"volume", "scrub", "--gen", "2"}, common...)...)
	if code != 0 {
		t.Fatalf("scrub exited %d: %s", code, errOut)
	}
	if !strings.Contains(out, "scrubbed replicas [0 1 2]") || strings.Contains(out, "rewrote 0") {
		t.Fatalf("first scrub printed %q; want all three scrubbed and blocks rewritten", out)
	}
	out, errOut, code = runTern(t, append([]string{"volume", "scrub", "--gen", "3"}, common...)...)
	if code != 0 || !strings.Contains(out, "rewrote 0\n") {
		t.Fatalf("second scrub exited %d, printed %q (%s); want nothing left to rewrite", code, out, errOut)
	}
}
