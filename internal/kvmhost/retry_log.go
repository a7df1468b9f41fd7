package kvmhost

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// RetryLogEnv names a file that every retry the KVM test harness makes is
// appended to, one line each. .ci/run sets it and prints the file and
// its count (`emulated-host retries: N`) at the end, so a retry shows in
// the CI log even when its package passes and go test hides its output.
const RetryLogEnv = "TERN_RETRY_LOG"

// RetryPrefix starts the line that says something ran again. A test
// inside the emulated host prints such lines on its stdout, where no log
// file of the host's is; kvmtest copies them from the machine's output
// into the log (CopyRetries).
const RetryPrefix = "RETRY: "

// NoteRetry says that something runs again, and why: one line on w,
// prefixed RetryPrefix, and the same line appended to $TERN_RETRY_LOG
// when it is set and reachable (it is not inside the emulated host).
func NoteRetry(w io.Writer, format string, args ...any) {
	line := RetryPrefix + strings.ReplaceAll(fmt.Sprintf(format, args...), "\n", " ") + "\n"
	if w != nil {
		io.WriteString(w, line)
	}
	appendRetries(line)
}

// CopyRetries appends the RetryPrefix lines of an emulated host's output
// to $TERN_RETRY_LOG.
func CopyRetries(output string) {
	var b strings.Builder
	for l := range strings.SplitSeq(output, "\n") {
		if strings.HasPrefix(l, RetryPrefix) {
			b.WriteString(strings.TrimRight(l, "\r") + " (inside the emulated host)\n")
		}
	}
	if b.Len() > 0 {
		appendRetries(b.String())
	}
}

// appendRetries appends lines to the log in one write (O_APPEND keeps
// concurrent test processes' lines whole); without a log, or where its
// directory does not exist, it does nothing.
func appendRetries(lines string) {
	path := os.Getenv(RetryLogEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	f.WriteString(lines)
}
