package main

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

func TestHelpListsEverySubcommand(t *testing.T) {
	out, _, code := runTern(t, "--help")
	if code != 0 {
		t.Fatalf("tern --help exited %d", code)
	}
	for _, cmd := range rootCmd.Commands() {
		if cmd.Hidden || cmd.Name() == "help" {
			continue
		}
		if !strings.Contains(out, cmd.Name()) || cmd.Short == "" {
			t.Errorf("help lacks %q or its one-line description", cmd.Name())
		}
	}
}

func TestVersionPrintsModuleVersion(t *testing.T) {
	out, _, code := runTern(t, "version")
	if code != 0 || !strings.HasPrefix(out, "tern ") {
		t.Fatalf("tern version = %q, exit %d", out, code)
	}
}

func TestCertsInitWritesFourFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if _, errOut, code := runTern(t, "certs", "init", "--dir", dir); code != 0 {
		t.Fatalf("certs init exited %d: %s", code, errOut)
	}
	for _, f := range []string{"ca.pem", "ca-key.pem", "node.pem", "node-key.pem"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Error(err)
		}
	}
}

// oneLineError checks the contract for bad input: exit 1 and a single line.
func oneLineError(t *testing.T, stderr string, code int) {
	t.Helper()
	if code != 1 {
		t.Fatalf("exit code %d, want 1 (stderr %q)", code, stderr)
	}
	if lines := strings.Count(strings.TrimRight(stderr, "\n"), "\n"); lines != 0 || stderr == "" {
		t.Fatalf("stderr is not one line: %q", stderr)
	}
}

func TestCertsInitOverExistingFilesFailsAndKeepsThem(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if _, errOut, code := runTern(t, "certs", "init", "--dir", dir); code != 0 {
		t.Fatalf("first certs init: %s", errOut)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "node.pem"))
	_, errOut, code := runTern(t, "certs", "init", "--dir", dir)
	oneLineError(t, errOut, code)
	if after, _ := os.ReadFile(filepath.Join(dir, "node.pem")); string(after) != string(before) {
		t.Fatal("refused certs init changed node.pem")
	}
	if _, errOut, code := runTern(t, "certs", "init", "--dir", dir, "--force"); code != 0 {
		t.Fatalf("certs init --force: %s", errOut)
	}
}

func TestCertsInitWhereAFileBlocksTheDirectoryFails(t *testing.T) {
	parent := t.TempDir()
	blocker := filepath.Join(parent, "blocker")
	if err := os.WriteFile(blocker, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := runTern(t, "certs", "init", "--dir", filepath.Join(blocker, "certs"))
	oneLineError(t, errOut, code)
	_, errOut, code = runTern(t, "certs", "init", "--dir", blocker)
	oneLineError(t, errOut, code)
	if entries, _ := os.ReadDir(parent); len(entries) != 1 {
		t.Fatalf("failed certs init left files: %v", entries)
	}
}

func TestCertsInitOnReadOnlyMountFails(t *testing.T) {
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_RDONLY, "size=1m"); err != nil {
		t.Skipf("cannot mount a read-only tmpfs here (needs root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) })
	_, errOut, code := runTern(t, "certs", "init", "--dir", filepath.Join(dir, "certs"))
	oneLineError(t, errOut, code)
	_, errOut, code = runTern(t, "certs", "init", "--dir", dir)
	oneLineError(t, errOut, code)
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("failed certs init left files: %v", entries)
	}
}
