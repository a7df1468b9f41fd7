package migratetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/child"
	"tern/internal/tlsconf"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
)

func TestMain(m *testing.M) { kvmtest.Main(m, kvmtest.WithTern()) }

// generous bounds every wait; nothing asserts on time.
const generous = 3 * time.Minute

func testCtx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), generous)
	t.Cleanup(cancel)
	return c
}

// startServe runs `tern vmm serve` on a free loopback port and returns a
// client of it; it is stopped at the end of the test.
func startServe(t *testing.T, certs string) *client.Client {
	t.Helper()
	cmd := exec.Command(kvmtest.Tern(t), "vmm", "serve", "--listen", "127.0.0.1:0", "--certs", certs)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	p, url, err := child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningURL, Wait: generous, What: "its URL"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	t.Cleanup(func() {
		p.Kill()
		if t.Failed() {
			t.Logf("tern vmm serve stderr:\n%s", stderr.String())
		}
	})
	c, err := client.New(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// syncBuffer is a bytes.Buffer safe for a process's writer goroutine and
// the test at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// serialFollower is a `tern instance serial` process whose stdout is
// read line by line; offset counts the console bytes it printed.
type serialFollower struct {
	lines chan string
	ended chan error
}

func startSerial(t *testing.T, server string) *serialFollower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, kvmtest.Tern(t), "instance", "serial", "--server", server)
	// An open, silent stdin: its end would not detach the console, but
	// keep it from mattering.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	f := &serialFollower{lines: make(chan string, 1<<14), ended: make(chan error, 1)}
	go func() {
		r := bufio.NewReader(stdout)
		for {
			line, err := r.ReadString('\n')
			if line != "" {
				f.lines <- line
			}
			if err != nil {
				break
			}
		}
		close(f.lines)
		f.ended <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cancel()
		stdin.Close()
		for range f.lines {
		}
		if t.Failed() {
			t.Logf("tern instance serial stderr:\n%s", stderr.String())
		}
	})
	return f
}

// consoleEnd returns the offset at the end of c's console now.
func consoleEnd(t *testing.T, c *client.Client) uint64 {
	t.Helper()
	var offset uint64
	for {
		h, err := c.SerialHistory(testCtx(t), offset, apiv1.MaxSerialMaxBytes)
		if err != nil {
			t.Fatal(err)
		}
		if h.NextOffset == offset {
			return offset
		}
		offset = h.NextOffset
	}
}

// dirtySpec is the dirty guest, small enough for the emulated host,
// rewriting its working set at 10 MiB/s and verifying every second.
func dirtySpec(id string) apiv1.Spec {
	return apiv1.Spec{ID: id, Name: "dirty", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "dirty", Params: map[string]uint64{
			"mem_mib": 48, "working_set_mib": 8, "dirty_mib_per_sec": 10, "verify_every_sec": 1}},
		Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
}

// TestTernMigrateMovesTheGuestAndTheConsoleFollows runs the dirty guest
// in one vmm, attaches `tern instance serial` to it, and runs `tern
// migrate` to a second vmm: migrate exits 0 with the figures once the
// target runs and the source is destroyed, and the console process
// carries on from the target through a verification the target's guest
// printed.
func TestTernMigrateMovesTheGuestAndTheConsoleFollows(t *testing.T) {
	kvmtest.Require(t)
	certs := filepath.Join(t.TempDir(), "certs")
	if err := tlsconf.Generate(certs, nil, false); err != nil {
		t.Fatal(err)
	}
	src, dst := startServe(t, certs), startServe(t, certs)
	ctx := testCtx(t)
	v, err := src.Ensure(ctx, dirtySpec("migrated"))
	if err != nil {
		t.Fatal(err)
	}
	if err := src.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := src.WaitFor(ctx, v.Gen, func(s apiv1.View) bool { return s.State == apiv1.Running }); err != nil {
		t.Fatal(err)
	}
	serial := startSerial(t, src.Base())
	var printed uint64 // console bytes the serial process printed
	waitLine := func(what string, match func(string) bool) {
		t.Helper()
		for {
			select {
			case line, ok := <-serial.lines:
				if !ok {
					t.Fatalf("tern instance serial ended (%v) while waiting for %s", <-serial.ended, what)
				}
				printed += uint64(len(line))
				if match(strings.TrimRight(line, "\r\n")) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			}
		}
	}
	isPass := func(l string) bool { v, ok := guests.ParseDirtyVerify(l); return ok && v.Pass }
	waitLine("the source's first verification", isPass)

	// host:port for --to, as every command that names a vmm takes it.
	cmd := exec.CommandContext(ctx, kvmtest.Tern(t), "migrate", "--from", src.Base(), "--to", strings.TrimPrefix(dst.Base(), "http://"))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("tern migrate: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	out := strings.TrimSpace(stdout.String())
	last := out[strings.LastIndexByte(out, '\n')+1:]
	var res struct {
		Result map[string]any `json:"result"`
	}
	if err := json.Unmarshal([]byte(last), &res); err != nil {
		t.Fatalf("tern migrate's last line %q: %v", last, err)
	}
	for _, k := range []string{"total_ms", "downtime_ms", "bytes_sent", "rounds"} {
		if f, ok := res.Result[k].(float64); !ok || f <= 0 {
			t.Errorf("tern migrate's result %q: %s = %v; want a figure above 0", last, k, res.Result[k])
		}
	}
	if g, err := dst.Get(ctx); err != nil || g.State != apiv1.Running {
		t.Fatalf("the target after tern migrate: %+v, %v; want running", g.State, err)
	}
	if g, err := src.Get(ctx); err == nil && g.State != apiv1.Destroyed {
		t.Fatalf("the source after tern migrate: %s; want destroyed or gone", g.State)
	}

	// Everything up to end was printed by the time migrate returned;
	// the serial process must go on past it, through the target.
	end := consoleEnd(t, dst)
	waitLine("a verification the target's guest printed", func(l string) bool { return printed > end && isPass(l) })
}
