package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/kvmhost"
	"tern/vmm/guests"
	"tern/vmm/kvm"
)

// upLines is tern up's stdout, line by line.
type upLines struct {
	lines chan string
	all   []string
}

// next returns the next line that match accepts, failing t at the
// deadline.
func (u *upLines) next(t *testing.T, what string, deadline <-chan time.Time, match func(string) bool) string {
	t.Helper()
	l, ok := u.nextOrEnd(t, what, deadline, match)
	if !ok {
		t.Fatalf("tern up's output ended before %s; it printed:\n%s", what, strings.Join(u.all, "\n"))
	}
	return l
}

// nextOrEnd is next, but says (ok false) when tern up's output ended
// first instead of failing t.
func (u *upLines) nextOrEnd(t *testing.T, what string, deadline <-chan time.Time, match func(string) bool) (string, bool) {
	t.Helper()
	for {
		select {
		case l, ok := <-u.lines:
			if !ok {
				return "", false
			}
			u.all = append(u.all, l)
			if match(l) {
				return l, true
			}
		case <-deadline:
			t.Fatalf("no %s in tern up's output in time; it printed:\n%s", what, strings.Join(u.all, "\n"))
		}
	}
}

// childrenOf lists the pids whose parent is pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may hold spaces.
		fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(fields) > 1 && fields[1] == strconv.Itoa(pid) {
			c, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			out = append(out, c)
		}
	}
	return out
}

// TestUpRunsTheDemoEchoesAndStopsEveryChildOnSIGTERM is the README's main
// job end to end: tern up with stdin not a terminal prints the API line
// first, the instance runs the demo guest, whose verified rounds and the
// echo of a line typed over the serial websocket appear on tern up's
// output; SIGTERM makes it exit 0 within 10 s with every child gone and
// its temporary data directory removed. "emulated" forces the vmm into
// the emulated test host (TERN_KVMHOST=always).
func TestUpRunsTheDemoEchoesAndStopsEveryChildOnSIGTERM(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		// children is how many processes tern up starts: three
		// downstairs and the vmm, or QEMU running it.
		children int
	}{
		{"kvm", "TERN_KVMHOST=auto", 4},
		{"emulated", "TERN_KVMHOST=always", 4},
		// --layout ec:4+2: six downstairs and the vmm.
		{"kvm-ec", "TERN_KVMHOST=auto", 7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.HasPrefix(tc.name, "kvm") {
				if err := kvm.Probe(); err != nil {
					t.Skipf("no usable /dev/kvm: %v", err)
				}
			} else {
				if kvmhost.InsideEmulatedHost() {
					t.Skip("inside the emulated test host: another would emulate within emulation")
				}
				if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
					t.Skip("qemu-system-x86_64 not installed (apt-get install qemu-system-x86)")
				}
			}
			var args []string
			if tc.name == "kvm-ec" {
				args = []string{"--layout", "ec:4+2"}
			}
			testUp(t, tc.env, tc.children, args...)
		})
	}
}

// upRun is a running `tern up`.
type upRun struct {
	cmd    *exec.Cmd
	lines  *upLines
	exited chan error // its Wait result, once its output ended
	// stderr is what it wrote there; read it only after exited.
	stderr *strings.Builder
	client *client.Client
	tmp    string // its TMPDIR
}

// startUp starts `tern up` with env added, stdin not a terminal, and
// returns once its instance runs; the test's end kills it if it still
// runs, and logs its stderr if the test failed.
func startUp(t *testing.T, env string, args ...string) *upRun {
	t.Helper()
	return startUpWithin(t, []string{env}, 5*time.Minute, args...)
}

// startUpWithin is startUp with the variables env added and urlWait for
// the API's URL (and for the vmm's start in the emulated host, after any
// wait for another one).
func startUpWithin(t *testing.T, env []string, urlWait time.Duration, args ...string) *upRun {
	t.Helper()
	tmp := t.TempDir()
	cmd := exec.Command(ternBin, append([]string{"up"}, args...)...)
	cmd.Env = append(append(os.Environ(), env...), "TMPDIR="+tmp)
	cmd.Stdin = nil // /dev/null: not a terminal
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	r := &upRun{cmd: cmd, lines: &upLines{lines: make(chan string, 4096)}, exited: make(chan error, 1), stderr: &stderr, tmp: tmp}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			r.lines.lines <- sc.Text()
		}
		close(r.lines.lines)
		r.exited <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("tern up stderr:\n%s", stderr.String())
		}
	})
	// With the vmm in the emulated host, tern up may first wait for
	// another package's emulated host (one at a time on a machine): the
	// deadline for the URL starts once that wait ended.
	deadline := time.After(urlWait)
	apiLine := r.lines.next(t, "URL", deadline, func(l string) bool {
		return strings.Contains(l, "://") || strings.HasPrefix(l, "kvmhost: waiting for another emulated test host")
	})
	if strings.HasPrefix(apiLine, "kvmhost: waiting") {
		r.lines.next(t, "the end of the wait for another emulated host", time.After(30*time.Minute), func(l string) bool {
			return strings.HasPrefix(l, "kvmhost: the other emulated host finished")
		})
		apiLine = r.lines.next(t, "URL", time.After(urlWait), func(l string) bool { return strings.Contains(l, "://") })
	}
	url, ok := strings.CutPrefix(apiLine, "API: ")
	if !ok || !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("the first URL is on %q; want API: http://127.0.0.1:PORT", apiLine)
	}
	if r.client, err = client.New(url, nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if _, err := r.client.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Running }); err != nil {
		t.Fatalf("waiting for running: %v", err)
	}
	return r
}

// verifiedRound waits for the demo guest's next verified round.
func (r *upRun) verifiedRound(t *testing.T, deadline <-chan time.Time) {
	t.Helper()
	r.lines.next(t, "verified demo round", deadline, func(l string) bool {
		d, ok := guests.ParseDemoRound(l)
		if ok && !d.OK {
			t.Fatalf("demo round failed: %q", l)
		}
		return ok && d.OK
	})
}

func testUp(t *testing.T, env string, children int, args ...string) {
	r := startUp(t, env, args...)
	deadline := time.After(5 * time.Minute)
	u, c := r.lines, r.client
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	if v, err := c.Get(ctx); err != nil || v.State != apiv1.Running {
		t.Fatalf("GET /v1/instance: %+v, %v; want running", v, err)
	}
	for range 2 {
		r.verifiedRound(t, deadline)
	}
	conn, err := c.Serial(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	const typed = "hello from the test"
	if err := conn.Write(ctx, websocket.MessageBinary, []byte(typed+"\n")); err != nil {
		t.Fatal(err)
	}
	u.next(t, "echo of the typed line", deadline, func(l string) bool { return l == guests.DemoEchoPrefix+typed })
	conn.Close(websocket.StatusNormalClosure, "")

	r.stopCleanly(t, syscall.SIGTERM, children)
}

// stopCleanly checks that tern up has children children, sends it sig,
// and checks that it exits 0 within 10 s with every child gone and its
// temporary directory empty.
func (r *upRun) stopCleanly(t *testing.T, sig syscall.Signal, children int) {
	t.Helper()
	pids := childrenOf(t, r.cmd.Process.Pid)
	if len(pids) != children {
		t.Fatalf("tern up has children %v; want %d", pids, children)
	}
	r.cmd.Process.Signal(sig)
	select {
	case err := <-r.exited:
		if err != nil {
			t.Fatalf("tern up after %v: %v; want exit 0", sig, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("tern up did not exit within 10 s of %v", sig)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("child %d of tern up still exists after it exited", pid)
		}
	}
	if left, _ := os.ReadDir(r.tmp); len(left) > 0 {
		t.Errorf("tern up left %v in its temporary directory", left)
	}
}

// TestUpSaysWhichChildDiedAndHow SIGKILLs one downstairs of a running
// `tern up`: it prints one line naming that downstairs and the signal,
// and the demo carries on with the other two replicas.
func TestUpSaysWhichChildDiedAndHow(t *testing.T) {
	if err := kvm.Probe(); err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	r := startUp(t, "TERN_KVMHOST=never")
	deadline := time.After(5 * time.Minute)
	r.verifiedRound(t, deadline)
	victim := 0
	for _, pid := range childrenOf(t, r.cmd.Process.Pid) {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil && strings.Contains(string(b), "downstairs\x00run") {
			victim = pid
			break
		}
	}
	if victim == 0 {
		t.Fatalf("tern up has no downstairs child among %v", childrenOf(t, r.cmd.Process.Pid))
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	line := r.lines.next(t, "a line saying the downstairs died", deadline, func(l string) bool { return strings.HasPrefix(l, "tern up: downstairs") })
	want := regexp.MustCompile(`^tern up: downstairs [123] \(pid ` + strconv.Itoa(victim) + `\) ended: signal: killed$`)
	if !want.MatchString(line) {
		t.Fatalf("tern up printed %q; want it to match %s", line, want)
	}
	for range 2 {
		r.verifiedRound(t, deadline)
	}
	r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-r.exited:
		if err != nil {
			t.Fatalf("tern up after SIGTERM: %v; want exit 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("tern up did not exit within 10 s of SIGTERM")
	}
	for l := range r.lines.lines { // the rest, to its end
		r.lines.all = append(r.lines.all, l)
	}
	for _, l := range r.lines.all {
		if strings.HasPrefix(l, "tern up: ") && strings.Contains(l, " ended: ") && l != line {
			t.Errorf("tern up reported %q as well; only the killed child ended on its own", l)
		}
	}
}
