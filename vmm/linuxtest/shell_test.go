package linuxtest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// chanLines is a LineSource fed by a goroutine reading a terminal.
type chanLines chan string

func (c chanLines) NextLine(ctx context.Context) (string, error) {
	select {
	case l, ok := <-c:
		if !ok {
			return "", errors.New("the terminal closed")
		}
		return l, nil
	case <-ctx.Done():
		return "", context.Cause(ctx)
	}
}

// ptyShell starts the host's /bin/sh, interactive, on a new pseudo
// terminal (which echoes what is typed, as a serial console's line
// discipline does) and returns a Shell on it. The shell is killed and the
// reader goroutine ends with the test.
func ptyShell(t *testing.T) *Shell {
	t.Helper()
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo terminals: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(master.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetInt(int(master.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	slave, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-i")
	cmd.Env = []string{"PS1=test$ ", "PATH=/usr/bin:/bin", "TERM=dumb", "ENV="}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	slave.Close()
	lines := make(chanLines, 256)
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(lines)
		sc := bufio.NewScanner(master)
		for sc.Scan() {
			lines <- strings.TrimRight(sc.Text(), "\r")
		}
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		master.Close()
		<-done
	})
	s := NewShell(master, lines)
	s.Limit = 30 * time.Second
	return s
}

func TestShellRunReturnsOutputAndStatus(t *testing.T) {
	s := ptyShell(t)
	ctx := t.Context()
	for _, c := range []struct {
		cmd, out string
		status   int
	}{
		{"echo hello; echo world", "hello\nworld", 0},
		{"false", "", 1},
		{"printf 'no newline'", "no newline", 0},
		{`echo "it's quoted" 'twice'`, "it's quoted twice", 0},
		{"cd /; pwd", "/", 0},
		{"pwd", "/", 0}, // the shell's own directory changed: eval, not a subshell
		{"(exit 7)", "", 7},
		{"echo tern-end 1 0; echo after", "tern-end 1 0\nafter", 0}, // a marker's text, without its byte
	} {
		out, status, err := s.Run(ctx, c.cmd)
		if err != nil || out != c.out || status != c.status {
			t.Errorf("Run(%q) = %q, %d, %v; want %q, %d", c.cmd, out, status, err, c.out, c.status)
		}
	}
	if _, _, err := s.Run(ctx, "echo a\necho b"); err == nil {
		t.Error("Run of two lines: no error")
	}
}

func TestShellRunSaysWhatItWaitedFor(t *testing.T) {
	s := ptyShell(t)
	s.Limit = 2 * time.Second
	_, _, err := s.Run(t.Context(), "exit 3") // the shell is gone: no end marker ever
	if err == nil || !strings.Contains(err.Error(), `running "exit 3" on the console: no marker of its end within 2s`) {
		t.Fatalf("Run(exit 3) = %v; want it to say it waited 2s for the end", err)
	}
}

func TestShellWaitReadyReportsFailedModules(t *testing.T) {
	s := ptyShell(t)
	// Octal escapes, so that the echo of the typed line holds neither
	// line.
	if err := s.Type(`printf 'tern-linux: m\157dule failed: virtio_net\ntern-linux: r\145ady\n'`); err != nil {
		t.Fatal(err)
	}
	err := s.WaitReady(t.Context())
	if !errors.Is(err, ErrModuleFailed) || !strings.HasSuffix(err.Error(), ": virtio_net") {
		t.Fatalf("WaitReady = %v; want ErrModuleFailed naming virtio_net", err)
	}
	if err := s.Type(`printf 'tern-linux: r\145ady\n'`); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitReady(t.Context()); err != nil {
		t.Fatalf("WaitReady = %v", err)
	}
}
