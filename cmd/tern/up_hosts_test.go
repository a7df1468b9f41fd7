package main

import (
	"bufio"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"tern/control/controlapi"

	"tern/vmm/guests"
	"tern/vmm/kvm"
)

// TestUpHostsDrainsTheDemoWhileItsConsoleKeepsPrinting runs tern up
// --hosts 3, drains the demo's host with the tern ctl command it
// suggests, and checks the demo then runs on another host, its console
// (followed across the migration) keeps printing verified rounds, and
// SIGTERM stops everything.
func TestUpHostsDrainsTheDemoWhileItsConsoleKeepsPrinting(t *testing.T) {
	if err := kvm.Probe(); err != nil {
		t.Skipf("no usable /dev/kvm: %v", err)
	}
	tmp := t.TempDir()
	cmd := exec.Command(ternBin, "up", "--hosts", "3")
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	u := &upLines{lines: make(chan string, 4096)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			u.lines <- sc.Text()
		}
		close(u.lines)
		exited <- cmd.Wait()
	}()
	defer func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
		}
		if t.Failed() {
			t.Logf("tern up --hosts 3 stderr:\n%s", stderr.String())
		}
	}()
	deadline := time.After(5 * time.Minute)

	first := u.next(t, "URL", deadline, func(l string) bool { return strings.Contains(l, "://") })
	controlURL, ok := strings.CutPrefix(first, "Control: ")
	if !ok || !strings.HasPrefix(controlURL, "http://127.0.0.1:") {
		t.Fatalf("the first URL is on %q; want Control: http://127.0.0.1:PORT", first)
	}
	drainLine := u.next(t, "a drain command", deadline, func(l string) bool { return strings.Contains(l, " host drain ") })
	fields := strings.Fields(drainLine)
	var host string
	for i, f := range fields {
		if f == "drain" && i+1 < len(fields) {
			host = fields[i+1]
		}
	}
	round := func(what string) guests.DemoRound {
		var r guests.DemoRound
		u.next(t, what, deadline, func(l string) bool {
			var ok bool
			r, ok = guests.ParseDemoRound(strings.TrimPrefix(l, "\r"))
			if ok && !r.OK {
				t.Fatalf("demo round failed: %q", l)
			}
			return ok
		})
		return r
	}
	round("a demo round before the drain")

	out, err := exec.Command(ternBin, "ctl", "--control", controlURL, "host", "drain", host).CombinedOutput()
	if err != nil {
		t.Fatalf("tern ctl host drain %s: %v\n%s", host, err, out)
	}
	var v controlapi.InstanceView
	out, err = exec.Command(ternBin, "ctl", "--control", controlURL, "--json", "instance", "get", "demo").Output()
	if err != nil || json.Unmarshal(out, &v) != nil {
		t.Fatalf("tern ctl instance get demo: %v: %s", err, out)
	}
	if v.State != "running" || v.Host == host || v.Host == "" {
		t.Fatalf("after draining %s the demo is %+v", host, v)
	}
	// What tern up printed until now came (at most but one line) from
	// the source; the rounds after, from the target.
	for pending := true; pending; {
		select {
		case l := <-u.lines:
			u.all = append(u.all, l)
		default:
			pending = false
		}
	}
	before := round("a demo round after the drain")
	after := round("a second demo round after the drain")
	if after.Round <= before.Round {
		t.Fatalf("demo rounds went from %d to %d", before.Round, after.Round)
	}

	cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("tern up --hosts 3 after SIGTERM: %v; want exit 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("tern up --hosts 3 did not exit within 30 s of SIGTERM")
	}
	if left, _ := os.ReadDir(tmp); len(left) > 0 {
		t.Errorf("tern up --hosts 3 left %v in its temporary directory", left)
	}
}

// TestUpHostsWantsThreeToEight refuses host counts a volume's three
// regions cannot be placed on, or past the loopback addresses it uses.
func TestUpHostsWantsThreeToEight(t *testing.T) {
	for _, n := range []string{"2", "9", "-1"} {
		_, stderr, code := runTern(t, "up", "--hosts", n)
		if code == 0 || !strings.Contains(stderr, "--hosts "+n+": want 3 to 8") {
			t.Errorf("tern up --hosts %s: exit %d, stderr %q", n, code, stderr)
		}
	}
}
