package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"tern/vmm/guests"
)

func TestGuestsBuildWritesEveryEmbeddedGuest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new", "dir")
	stdout, stderr, code := runTern(t, "guests", "build", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, name := range guests.Names() {
		path := filepath.Join(dir, name+".elf")
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := guests.ELF(name)
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the embedded guest", path)
		}
		if !strings.Contains(stdout, path+"\n") {
			t.Errorf("stdout %q does not list %s", stdout, path)
		}
	}
}

func TestGuestsBuildWithoutOutFails(t *testing.T) {
	_, stderr, code := runTern(t, "guests", "build")
	if code == 0 || !strings.Contains(stderr, "--out") {
		t.Errorf("exit %d stderr %q, want a failure naming --out", code, stderr)
	}
}
