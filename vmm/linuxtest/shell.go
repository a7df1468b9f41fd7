package linuxtest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	"tern/vmm/devices"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
)

// LineSource yields a console's output a line at a time.
type LineSource interface {
	// NextLine returns the next complete line without its line ending
	// ("\n" or "\r\n"), waiting for it until ctx ends.
	NextLine(ctx context.Context) (string, error)
}

// Shell drives a shell on a serial console: it types command lines into
// in and reads their output from lines. Each command is framed by marker
// lines that start with the byte 0x1e (record separator), which the shell
// prints through printf's octal escape but which never appears in the
// echo of what was typed, so neither the terminal's echo nor the shell's
// line editing can be taken for output or for the end of a command.
//
// A Shell is used by one goroutine.
type Shell struct {
	in    io.Writer
	lines LineSource
	// Limit bounds each Run and Wait (default DefaultShellLimit).
	Limit time.Duration
	seq   int
	seen  []string // the last lines read, for errors
}

// DefaultShellLimit is a Shell's default Limit: one command of the tests'
// (mkfs of a small disk, a checksum) in the emulated host with the rest of
// the suite on the same cores.
const DefaultShellLimit = 3 * time.Minute

// seenMax is how many lines a Shell keeps for its errors.
const seenMax = 40

// markerByte starts the marker lines; markerEscape is how it is typed.
const (
	markerByte   = "\x1e"
	markerEscape = `\036`
)

// NewShell returns a Shell typing into in and reading lines.
func NewShell(in io.Writer, lines LineSource) *Shell {
	return &Shell{in: in, lines: lines, Limit: DefaultShellLimit}
}

// Type types line and a newline, as is.
func (s *Shell) Type(line string) error {
	if _, err := io.WriteString(s.in, line+"\n"); err != nil {
		return fmt.Errorf("typing %q: %w", line, err)
	}
	return nil
}

// next reads one line within the deadline of ctx, keeping it in seen.
func (s *Shell) next(ctx context.Context) (string, error) {
	line, err := s.lines.NextLine(ctx)
	if err != nil {
		return "", err
	}
	s.seen = append(s.seen, line)
	if len(s.seen) > seenMax {
		s.seen = s.seen[len(s.seen)-seenMax:]
	}
	return line, nil
}

// Seen returns the last lines read, oldest first, joined.
func (s *Shell) Seen() string { return strings.Join(s.seen, "\n") }

// WaitFor reads lines until one satisfies match and returns it; what
// says what it waits for in the error when none comes within Limit.
func (s *Shell) WaitFor(ctx context.Context, what string, match func(string) bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Limit)
	defer cancel()
	for {
		line, err := s.next(ctx)
		if err != nil {
			return "", fmt.Errorf("waiting for %s on the console (up to %v; %s): %w; its last lines:\n%s", what, s.Limit, kvmtest.ConsoleStall, err, s.Seen())
		}
		if match(line) {
			return line, nil
		}
	}
}

// ErrModuleFailed reports that the userland's /init could not load a
// kernel module.
var ErrModuleFailed = errors.New("a kernel module failed to load")

// WaitReady waits for linuxguest.ReadyLine, and fails with
// ErrModuleFailed if the init named a module it could not load first.
func (s *Shell) WaitReady(ctx context.Context) error {
	var failed []string
	_, err := s.WaitFor(ctx, "the userland's ready line", func(l string) bool {
		if _, m, ok := strings.Cut(l, linuxguest.ModuleFailedPrefix); ok {
			failed = append(failed, strings.TrimSpace(m))
		}
		return strings.Contains(l, linuxguest.ReadyLine)
	})
	if err != nil {
		return err
	}
	if len(failed) > 0 {
		return fmt.Errorf("booting the userland: %w: %s", ErrModuleFailed, strings.Join(failed, ", "))
	}
	return nil
}

// Run types cmd (one line of sh; it runs in the shell itself, through
// eval, so cd and variables persist) and returns what it printed, its
// lines joined by "\n" with no trailing newline, and its exit status. The
// wait for the command's end is bounded by Limit.
func (s *Shell) Run(ctx context.Context, cmd string) (string, int, error) {
	if strings.ContainsAny(cmd, "\n\r"+markerByte) {
		return "", 0, fmt.Errorf("running %q: a command is one line, without byte 0x1e", cmd)
	}
	s.seq++
	begin := fmt.Sprintf("%stern-begin %d", markerByte, s.seq)
	end := fmt.Sprintf("%stern-end %d ", markerByte, s.seq)
	quoted := "'" + strings.ReplaceAll(cmd, "'", `'\''`) + "'"
	line := fmt.Sprintf(`printf '%stern-begin %d\n'; eval %s; printf '%stern-end %d %%d\n' $?`,
		markerEscape, s.seq, quoted, markerEscape, s.seq)
	if err := s.Type(line); err != nil {
		return "", 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.Limit)
	defer cancel()
	var out []string
	started := false
	for {
		l, err := s.next(ctx)
		if err != nil {
			what := "its start"
			if started {
				what = "its end"
			}
			return strings.Join(out, "\n"), 0, fmt.Errorf("running %q on the console: no marker of %s within %v (%s): %w; its last lines:\n%s", cmd, what, s.Limit, kvmtest.ConsoleStall, err, s.Seen())
		}
		if !started {
			started = strings.Contains(l, begin)
			continue
		}
		i := strings.Index(l, end)
		if i < 0 {
			out = append(out, l)
			continue
		}
		if i > 0 { // output without a final newline
			out = append(out, l[:i])
		}
		status, err := strconv.Atoi(strings.TrimSpace(l[i+len(end):]))
		if err != nil {
			return strings.Join(out, "\n"), 0, fmt.Errorf("running %q on the console: end marker %q: %w", cmd, l[i:], err)
		}
		return strings.Join(out, "\n"), status, nil
	}
}

// MustRun is Run for a test: it fails t unless cmd ran and exited 0, and
// returns its output.
func (s *Shell) MustRun(t testing.TB, cmd string) string {
	t.Helper()
	out, status, err := s.Run(t.Context(), cmd)
	if err != nil {
		t.Fatal(err)
	}
	if status != 0 {
		t.Fatalf("%s: status %d, output %q; the console's last lines:\n%s", cmd, status, out, s.Seen())
	}
	return out
}

// UARTShell is a Shell on a VM's serial port: it types through the
// UART's input queue and reads its output history from the start, so a
// line printed before the Shell was made is not missed. Close it when
// done.
type UARTShell struct {
	*Shell
	lines *devices.HistoryLines
}

// NewUARTShell returns a Shell on u.
func NewUARTShell(u *devices.UART) *UARTShell {
	h := u.Output()
	start, _ := h.Bounds()
	lines := devices.NewHistoryLines(h, start)
	return &UARTShell{Shell: NewShell(uartInput{u}, lines), lines: lines}
}

// Close stops following the UART's output.
func (s *UARTShell) Close() { s.lines.Close() }

// uartInput types into a UART's input queue.
type uartInput struct{ u *devices.UART }

func (w uartInput) Write(p []byte) (int, error) {
	n := w.u.Input(p)
	if n < len(p) {
		return n, fmt.Errorf("writing to the UART: its input queue took %d of %d bytes: %w", n, len(p), io.ErrShortWrite)
	}
	return n, nil
}
