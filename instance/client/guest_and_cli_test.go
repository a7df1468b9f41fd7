package client_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
)

// TestDirtyGuestRunsUntilStoppedAndVerifiesItsPattern runs dirty with
// its API parameters: it keeps dirtying and, every second, verifies its
// whole pattern on the console.
func TestDirtyGuestRunsUntilStoppedAndVerifiesItsPattern(t *testing.T) {
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	spec := apiv1.Spec{ID: "dirty", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "dirty", Params: map[string]uint64{
			"mem_mib": 16, "working_set_mib": 4, "dirty_mib_per_sec": 64, "verify_every_sec": 1}},
		Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	if _, err := c.Ensure(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	conn, err := c.Serial(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var console strings.Builder
	passes := 0
	for passes < 2 {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("reading console: %v (got %q)", err, console.String())
		}
		console.Write(msg)
		passes = 0
		for line := range strings.SplitSeq(console.String(), "\n") {
			v, ok := guests.ParseDirtyVerify(strings.TrimRight(line, "\r"))
			if ok && !v.Pass {
				t.Fatalf("dirty failed its verification: %q", line)
			}
			if ok && v.Pass && strings.HasSuffix(line, "\r") {
				passes++
			}
		}
	}
	if v, err := c.Get(ctx); err != nil || v.State != apiv1.Running {
		t.Fatalf("after two verifications: %+v, %v; want still running", v, err)
	}
	if err := c.RequestState(ctx, apiv1.Stop); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
		t.Fatal(err)
	}
}

// TestAPITLSRequiresAClientCertificateFromTheCA serves the API over
// HTTPS: a client with the CA's certificate gets answers, one without is
// refused at the handshake.
func TestAPITLSRequiresAClientCertificateFromTheCA(t *testing.T) {
	p := startVMM(t, "", "--api-tls")
	if !strings.HasPrefix(p.url, "https://") {
		t.Fatalf("url %q; want https", p.url)
	}
	if _, err := p.client.Get(ctx(t)); !client.IsCode(err, apiv1.CodeNoInstance) {
		t.Fatalf("GET over mutual TLS: %v; want 404 no_instance", err)
	}
	anon, err := client.New(p.url, &http.Client{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := anon.Get(ctx(t)); err == nil || client.IsCode(err, apiv1.CodeNoInstance) {
		t.Fatalf("GET without a client certificate: %v; want a TLS error", err)
	}
}

func runTern(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx(t), kvmtest.Tern(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// TestInstanceCLIDrivesTheInstance runs `tern instance` against a real
// vmm: ensure (and a bad spec refused with its problems), run, watch as
// JSON lines until destroyed, serial both ways until Ctrl-], get, stop,
// and reboot refused afterwards.
func TestInstanceCLIDrivesTheInstance(t *testing.T) {
	p := startVMM(t, "")
	server := strings.TrimPrefix(p.url, "http://") // host:port works too
	specFile := filepath.Join(t.TempDir(), "spec.json")
	b, _ := json.Marshal(echoSpec("cli"))
	if err := os.WriteFile(specFile, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runTern(t, "instance", "ensure", "--spec", specFile, "--server", server)
	if code != 0 || !strings.Contains(out, `"state": "creating"`) {
		t.Fatalf("ensure exited %d: %s %s", code, out, errOut)
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"id":"x","memory_mib":0}`), 0o644)
	if _, errOut, code := runTern(t, "instance", "ensure", "--spec", bad, "--server", p.url); code == 0 || !strings.Contains(errOut, "invalid_spec") || !strings.Contains(errOut, "memory_mib") {
		t.Fatalf("bad ensure exited %d: %s", code, errOut)
	}
	// watch follows the monitor as JSON lines (stdout is not a terminal).
	watch := exec.CommandContext(ctx(t), kvmtest.Tern(t), "instance", "watch", "--server", p.url)
	stdout, err := watch.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := watch.Start(); err != nil {
		t.Fatal(err)
	}
	if _, _, code := runTern(t, "instance", "run", "--server", p.url); code != 0 {
		t.Fatalf("run exited %d", code)
	}
	lines := bufio.NewScanner(stdout)
	var states []string
	for lines.Scan() {
		var s struct {
			Gen   uint64 `json:"gen"`
			State string `json:"state"`
		}
		if err := json.Unmarshal(lines.Bytes(), &s); err != nil {
			t.Fatalf("watch line %q: %v", lines.Text(), err)
		}
		if s.State == "" {
			continue // a disk progress line
		}
		states = append(states, s.State)
		if s.State == "running" {
			break
		}
	}
	// serial replays the console, types what stdin gives, and leaves at
	// Ctrl-].
	serial := exec.CommandContext(ctx(t), kvmtest.Tern(t), "instance", "serial", "--server", p.url)
	serialIn, err := serial.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	serialOut, err := serial.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := serial.Start(); err != nil {
		t.Fatal(err)
	}
	console := bufio.NewScanner(serialOut)
	waitLine := func(want string) {
		t.Helper()
		for console.Scan() {
			if strings.TrimRight(console.Text(), "\r") == want {
				return
			}
		}
		t.Fatalf("serial ended before %q: %v", want, console.Err())
	}
	waitLine("echo: ready")
	io.WriteString(serialIn, "from the cli\n")
	waitLine("echo: from the cli")
	serialIn.Write([]byte{0x1d})
	if err := serial.Wait(); err != nil {
		t.Fatalf("serial after Ctrl-]: %v", err)
	}
	out, _, code = runTern(t, "instance", "get", "--server", p.url)
	if code != 0 || !strings.Contains(out, `"state": "running"`) {
		t.Fatalf("get exited %d: %s", code, out)
	}
	if _, _, code := runTern(t, "instance", "stop", "--server", p.url); code != 0 {
		t.Fatalf("stop exited %d", code)
	}
	for lines.Scan() {
		var s struct{ State string }
		json.Unmarshal(lines.Bytes(), &s)
		if s.State != "" {
			states = append(states, s.State)
		}
	}
	if err := watch.Wait(); err != nil {
		t.Fatalf("watch: %v", err)
	}
	if len(states) == 0 || states[len(states)-1] != "destroyed" {
		t.Fatalf("watch saw %v; want it to end at destroyed", states)
	}
	if _, errOut, code := runTern(t, "instance", "reboot", "--server", p.url); code == 0 || !strings.Contains(errOut, "wrong_state") {
		t.Fatalf("reboot after destroyed exited %d: %s", code, errOut)
	}
}

// TestSIGTERMStopsTheInstanceAndExits sends SIGTERM to a vmm whose guest
// runs: watchers see it stop and be destroyed, and the process exits 0.
func TestSIGTERMStopsTheInstanceAndExits(t *testing.T) {
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	if _, err := c.Ensure(ctx, echoSpec("term")); err != nil {
		t.Fatal(err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	running, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Running })
	if err != nil {
		t.Fatal(err)
	}
	var states []apiv1.State
	watched := make(chan error, 1)
	go func() {
		_, err := c.WaitFor(ctx, running.Gen, func(s apiv1.View) bool {
			states = append(states, s.State)
			return s.State == apiv1.Destroyed
		})
		watched <- err
	}()
	if err := p.terminate(t); err != nil {
		t.Fatalf("exit after SIGTERM: %v", err)
	}
	// The server stays up until the watcher, even one between two
	// long-polls, has fetched destroyed.
	if err := <-watched; err != nil {
		t.Fatalf("watcher saw %v, then: %v", states, err)
	}
	log := p.stderr.String()
	if !strings.Contains(log, `"state":"destroyed"`) {
		t.Fatalf("log lacks the destroyed state:\n%s", log)
	}
	if len(states) == 0 || states[len(states)-1] != apiv1.Destroyed {
		t.Fatalf("watcher saw %v", states)
	}
}
