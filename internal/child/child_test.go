package child

import (
	"bytes"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// lockedBuffer is a bytes.Buffer the scanner writes while the test reads.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestStartReturnsTheReadyLinesValue(t *testing.T) {
	var log lockedBuffer
	cmd := exec.Command("sh", "-c", `echo starting; echo "listening on http://127.0.0.1:9"; exec sleep 600`)
	p, url, err := Start(cmd, Options{Ready: Ready{Match: ListeningURL, Log: &log, Wait: time.Minute, What: "its URL"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop(time.Minute)
	if url != "http://127.0.0.1:9" {
		t.Fatalf("url %q", url)
	}
	if !strings.HasPrefix(log.String(), "starting\n") {
		t.Fatalf("log %q; want the lines before the ready one", log.String())
	}
	p.Stop(time.Minute)
	select {
	case <-p.Exited():
	default:
		t.Fatal("Stop returned before the child was reaped")
	}
}

func TestStartReadsTheLineOnStderr(t *testing.T) {
	cmd := exec.Command("sh", "-c", `echo '{"msg":"listening","addr":"127.0.0.1:7"}' >&2; exec sleep 600`)
	p, addr, err := Start(cmd, Options{Ready: Ready{Match: ListeningAddr, Stderr: true, Wait: time.Minute, What: "its listening record"}})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	if addr != "127.0.0.1:7" {
		t.Fatalf("addr %q", addr)
	}
}

func TestStartSaysTheChildExitedFirst(t *testing.T) {
	var exits int
	cmd := exec.Command("sh", "-c", "echo nothing; exit 3")
	_, _, err := Start(cmd, Options{Ready: Ready{Match: ListeningURL, Wait: time.Minute, What: "its URL"},
		OnExit: func(*Process) { exits++ }})
	if err == nil || !strings.Contains(err.Error(), "starting sh -c: it exited before it printed its URL (exit status 3)") {
		t.Fatalf("err %v", err)
	}
	if exits != 1 {
		t.Fatalf("OnExit ran %d times; want once before Start returned", exits)
	}
}

func TestStartStopsAChildThatIsNotReadyInTime(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	_, _, err := Start(cmd, Options{Ready: Ready{Match: ListeningURL, Wait: 100 * time.Millisecond, What: "its URL"}})
	if err == nil || !strings.Contains(err.Error(), "starting sleep 600: it did not print its URL within 100ms") {
		t.Fatalf("err %v", err)
	}
	if cmd.ProcessState == nil {
		t.Fatal("the child was not reaped")
	}
}

func TestListeningMatchers(t *testing.T) {
	for _, tc := range []struct {
		match func([]byte) (string, bool)
		line  string
		want  string
		ok    bool
	}{
		{ListeningURL, "listening on http://a", "http://a", true},
		{ListeningURL, "listening on ", "", false},
		{ListeningURL, "hello", "", false},
		{ListeningAddr, `{"level":"INFO","msg":"listening","addr":"1.2.3.4:5"}`, "1.2.3.4:5", true},
		{ListeningAddr, `{"msg":"listening"}`, "", false},
		{ListeningAddr, `listening`, "", false},
	} {
		got, ok := tc.match([]byte(tc.line))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%q: %q %v; want %q %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}
