package kvmhost

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRetriesReachTheLogFromBothSides checks the two ways a retry
// reaches $TERN_RETRY_LOG: NoteRetry on this side (its line also on the
// writer, one line however many the reason has), and CopyRetries of the
// RETRY lines in an emulated host's output, which says where they came
// from and leaves every other line out.
func TestRetriesReachTheLogFromBothSides(t *testing.T) {
	path := filepath.Join(t.TempDir(), "retries.log")
	t.Setenv(RetryLogEnv, path)
	var out strings.Builder
	NoteRetry(&out, "kvmhost: %s; booting again", "stalled\nfor 90 s")
	if got, want := out.String(), "RETRY: kvmhost: stalled for 90 s; booting again\n"; got != want {
		t.Errorf("NoteRetry wrote %q, want %q", got, want)
	}
	CopyRetries("=== RUN TestX\nRETRY: TestX: no init line; booting once more\r\n--- PASS: TestX\n")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := "RETRY: kvmhost: stalled for 90 s; booting again\n" +
		"RETRY: TestX: no init line; booting once more (inside the emulated host)\n"
	if string(b) != want {
		t.Errorf("the log holds %q, want %q", b, want)
	}
	t.Setenv(RetryLogEnv, filepath.Join(t.TempDir(), "no", "such", "dir", "log"))
	NoteRetry(nil, "nowhere to write") // must not fail or create anything
}
