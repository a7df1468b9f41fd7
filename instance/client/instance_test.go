package client_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/coder/websocket"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/vmm/guests"
)

func echoSpec(id string) apiv1.Spec {
	return apiv1.Spec{ID: id, Name: "echo", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "echo"}, Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
}

// silentTargets returns three loopback UDP addresses held open by the
// test and never read: a downstairs that never answers.
func silentTargets(t *testing.T) []string {
	t.Helper()
	var out []string
	for range 3 {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		out = append(out, c.LocalAddr().String())
	}
	return out
}

func wantCode(t *testing.T, err error, status int, code string) *client.APIError {
	t.Helper()
	var e *client.APIError
	if !errors.As(err, &e) || e.Status != status || e.Body.ErrorCode != code {
		t.Fatalf("err = %v; want %d %s", err, status, code)
	}
	return e
}

// goroutines reads the vmm's go_goroutines from /metrics over a fresh
// connection, after closing the idle ones, so the API's own connections
// count the same every time.
func goroutines(t *testing.T, p *vmmProc) string {
	t.Helper()
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	resp, err := http.Get(p.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	for line := range strings.SplitSeq(buf.String(), "\n") {
		if v, ok := strings.CutPrefix(line, "go_goroutines "); ok {
			return v
		}
	}
	t.Fatalf("no go_goroutines in /metrics")
	return ""
}

// guestResources are the fds that belong to a VM or a volume: guest
// memory, KVM and sockets other than the API's own listener.
func guestResources(fds []string) []string {
	var out []string
	for _, f := range fds {
		if strings.HasPrefix(f, "/memfd:") || strings.Contains(f, "kvm") {
			out = append(out, f)
		}
	}
	return out
}

func countSockets(fds []string) int {
	n := 0
	for _, f := range fds {
		if strings.HasPrefix(f, "socket:") {
			n++
		}
	}
	return n
}

// TestEnsureReturnsAtOnceAndStopDuringActivationDestroysController is
// the seed's four behaviours over a real tern vmm: ensure answers 201
// while no replica of the disk answers (activation cannot end), the
// instance is creating and then starting with activation progress,
// reboot is 409 wrong_state, and stop aborts activation and destroys
// the controller, leaving no goroutine, fd, QUIC socket or guest memory.
func TestEnsureReturnsAtOnceAndStopDuringActivationDestroysController(t *testing.T) {
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	pid := p.cmd.Process.Pid
	if _, err := c.Get(ctx); !client.IsCode(err, apiv1.CodeNoInstance) {
		t.Fatalf("GET before ensure: %v; want 404 no_instance", err)
	}
	baseFDs, baseG := fdsOf(t, pid), goroutines(t, p)

	spec := echoSpec("slow-volume")
	wait := uint64(60_000)
	spec.Disks = []apiv1.DiskSpec{{Name: "root", Backend: apiv1.BackendSpec{
		Kind: apiv1.BackendVolume, Targets: silentTargets(t),
		Region: &apiv1.RegionSpec{BlockSize: 4096, ExtentBlocks: 64, ExtentCount: 4}, Gen: 1, QuorumWaitMs: &wait,
	}}}
	v, err := c.Ensure(ctx, spec)
	if err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if v.State != apiv1.Creating || v.Gen == 0 {
		t.Fatalf("ensure answered %s gen %d; want creating", v.State, v.Gen)
	}
	if _, err := c.Ensure(ctx, spec); err != nil {
		t.Fatalf("repeating the same ensure: %v; want 201", err)
	}
	if _, err := c.Ensure(ctx, echoSpec("another")); !client.IsCode(err, apiv1.CodeConflict) {
		t.Fatalf("ensure of another id: %v; want 409 %s", err, apiv1.CodeConflict)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatalf("run while creating: %v", err)
	}
	snap, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Starting })
	if err != nil {
		t.Fatalf("waiting for starting: %v", err)
	}
	got, err := c.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != apiv1.Starting || len(got.Disks) != 1 || got.Disks[0].State != apiv1.DiskActivating ||
		got.Disks[0].Activation == nil || got.Disks[0].Activation.Phase != "negotiating" {
		t.Fatalf("while activating: %+v; want starting with disk root activating, phase negotiating", got)
	}
	d, err := c.Disk(ctx, "root")
	if err != nil || len(d.Replicas) != 3 {
		t.Fatalf("disk root: %+v, %v; want three replicas", d, err)
	}
	err = c.RequestState(ctx, apiv1.Reboot)
	e := wantCode(t, err, http.StatusConflict, apiv1.CodeWrongState)
	if e.Body.State == nil || *e.Body.State != apiv1.Starting || e.Body.Message == "" {
		t.Fatalf("reboot while starting: %+v; want state starting and a message", e.Body)
	}

	if err := c.RequestState(ctx, apiv1.Stop); err != nil {
		t.Fatalf("stop while activating: %v", err)
	}
	final, err := c.WaitFor(ctx, snap.Gen, func(s apiv1.View) bool { return s.State == apiv1.Destroyed })
	if err != nil {
		t.Fatalf("waiting for destroyed: %v", err)
	}
	if _, err := c.Monitor(ctx, final.Gen); !client.IsCode(err, apiv1.CodeInstanceGone) {
		t.Fatalf("monitor past destroyed: %v; want 410", err)
	}
	if got, err := c.Get(ctx); err != nil || got.State != apiv1.Destroyed || got.Gen != final.Gen {
		t.Fatalf("GET after destroyed: %+v, %v; want the last snapshot", got, err)
	}
	// The leak check: nothing of the instance survives. fds and
	// goroutines of the closed API connections end asynchronously, so
	// this looks again until they match or the deadline passes.
	var fds []string
	var g string
	for {
		fds, g = fdsOf(t, pid), goroutines(t, p)
		if len(guestResources(fds)) == 0 && countSockets(fds) <= countSockets(baseFDs) && g == baseG {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("after destroyed: fds %q, goroutines %s; before ensure fds %q, goroutines %s", fds, g, baseFDs, baseG)
		}
		runtimeGosched()
	}
	// A new ensure is accepted and its gens continue.
	v, err = c.Ensure(ctx, echoSpec("after"))
	if err != nil || v.Gen <= final.Gen {
		t.Fatalf("ensure after destroyed: %+v, %v; want accepted with gen > %d", v, err, final.Gen)
	}
}

// TestMonitorSerialHistoryAndWebsocket runs the echo guest through the
// API: gens strictly increase, the serial history and websocket replay
// what it printed, typed input comes back, a reboot restarts it with its
// history kept, and stop destroys it.
func TestMonitorSerialHistoryAndWebsocket(t *testing.T) {
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	if _, err := c.Ensure(ctx, echoSpec("echo")); err != nil {
		t.Fatal(err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	var seen []apiv1.View
	follow := func(after apiv1.ViewGen, want apiv1.State) apiv1.View {
		s, err := c.WaitFor(ctx, after, func(s apiv1.View) bool {
			seen = append(seen, s)
			return s.State == want
		})
		if err != nil {
			t.Fatalf("waiting for %s: %v (seen %+v)", want, err, seen)
		}
		return s
	}
	running := follow(0, apiv1.Running)

	conn, err := c.Serial(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var console strings.Builder
	readUntil := func(want string) {
		for !strings.Contains(console.String(), want) {
			_, msg, err := conn.Read(ctx)
			if err != nil {
				t.Fatalf("reading console for %q: %v (got %q)", want, err, console.String())
			}
			console.Write(msg)
		}
	}
	readUntil("echo: ready\r\n")
	if err := conn.Write(ctx, websocket.MessageBinary, []byte("tern\n")); err != nil {
		t.Fatal(err)
	}
	readUntil("echo: tern")

	h, err := c.SerialHistory(ctx, 0, 0)
	if err != nil || h.FromOffset != 0 || !strings.Contains(h.Data, "echo: ready") || !strings.Contains(h.Data, "echo: tern") {
		t.Fatalf("history: %+v, %v", h, err)
	}
	part, err := c.SerialHistory(ctx, 2, 3)
	if err != nil || part.Data != h.Data[2:5] || part.FromOffset != 2 || part.NextOffset != 5 {
		t.Fatalf("history from 2, 3 bytes: %+v, %v; want %q", part, err, h.Data[2:5])
	}
	if _, err := c.SerialHistory(ctx, h.NextOffset+1000, 0); !client.IsCode(err, apiv1.CodeOffsetAhead) {
		t.Fatalf("history past the end: %v", err)
	}

	if err := c.RequestState(ctx, apiv1.Reboot); err != nil {
		t.Fatalf("reboot while running: %v", err)
	}
	follow(running.Gen, apiv1.Running)
	for strings.Count(console.String(), "echo: ready") < 2 {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("reading console after reboot: %v (got %q)", err, console.String())
		}
		console.Write(msg)
	}

	if err := c.RequestState(ctx, apiv1.Stop); err != nil {
		t.Fatal(err)
	}
	final := follow(seen[len(seen)-1].Gen, apiv1.Destroyed)
	for i := 1; i < len(seen); i++ {
		if seen[i].Gen <= seen[i-1].Gen {
			t.Fatalf("gens not strictly increasing: %+v", seen)
		}
	}
	if err := c.RequestState(ctx, apiv1.Run); !client.IsCode(err, apiv1.CodeWrongState) {
		t.Fatalf("run after destroyed: %v; want 409 wrong_state", err)
	}
	if err := c.RequestState(ctx, apiv1.Stop); err != nil {
		t.Fatalf("stop after destroyed: %v; want ignored (204)", err)
	}
	// The websocket closes normally once the instance is gone.
	for {
		_, _, err := conn.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("console after destroyed: %v; want a normal close", err)
			}
			break
		}
	}
	if h, err := c.SerialHistory(ctx, 0, 0); err != nil || !strings.Contains(h.Data, "echo: tern") {
		t.Fatalf("history after destroyed: %+v, %v", h, err)
	}
	if final.State != apiv1.Destroyed {
		t.Fatalf("final snapshot %+v", final)
	}
}

// TestBadInputIsRejectedAndNothingRuns sends every kind of bad ensure
// and state request: each is a clear 4xx JSON error and no instance
// comes to exist.
func TestBadInputIsRejectedAndNothingRuns(t *testing.T) {
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	specJSON := func(mutate func(m map[string]any)) []byte {
		b, _ := json.Marshal(echoSpec("bad"))
		var m map[string]any
		json.Unmarshal(b, &m)
		mutate(m)
		b, _ = json.Marshal(m)
		return b
	}
	fileDisk := func(name string) map[string]any {
		return map[string]any{"name": name, "backend": map[string]any{"kind": "file", "path": "/etc/hostname"}}
	}
	for _, tc := range []struct {
		name    string
		body    []byte
		status  int
		code    string
		problem string
	}{
		{"malformed JSON", []byte(`{"id":`), 400, apiv1.CodeMalformed, ""},
		{"trailing data", append(specJSON(func(map[string]any) {}), []byte(`{}`)...), 400, apiv1.CodeMalformed, ""},
		{"unknown field", specJSON(func(m map[string]any) { m["colour"] = "blue" }), 400, apiv1.CodeMalformed, ""},
		{"unknown nested field", specJSON(func(m map[string]any) { m["guest"].(map[string]any)["bootloader"] = "x" }), 400, apiv1.CodeMalformed, ""},
		{"memory 0", specJSON(func(m map[string]any) { m["memory_mib"] = 0 }), 400, apiv1.CodeInvalidSpec, "memory_mib"},
		{"vcpus beyond the host", specJSON(func(m map[string]any) { m["vcpus"] = 100000 }), 400, apiv1.CodeInvalidSpec, "vcpus"},
		{"missing guest file", specJSON(func(m map[string]any) { m["guest"].(map[string]any)["path"] = "/no/such/guest.elf" }), 400, apiv1.CodeInvalidSpec, "guest.path"},
		{"unknown built-in guest", specJSON(func(m map[string]any) { m["guest"].(map[string]any)["path"] = "nosuch" }), 400, apiv1.CodeInvalidSpec, "guest.path"},
		{"unknown guest param", specJSON(func(m map[string]any) {
			m["guest"].(map[string]any)["path"] = "dirty"
			m["guest"].(map[string]any)["params"] = map[string]any{"mem_mib": 8, "speed": 3}
		}), 400, apiv1.CodeInvalidSpec, "guest.params.speed"},
		{"dirty idle neither 0 nor 1", specJSON(func(m map[string]any) {
			m["guest"].(map[string]any)["path"] = "dirty"
			m["guest"].(map[string]any)["params"] = map[string]any{"mem_mib": 8, "idle": 2}
		}), 400, apiv1.CodeInvalidSpec, "guest.params.idle"},
		{"duplicate disk names", specJSON(func(m map[string]any) { m["disks"] = []any{fileDisk("a"), fileDisk("a")} }), 400, apiv1.CodeInvalidSpec, "duplicate"},
		{"unknown component kind", specJSON(func(m map[string]any) {
			m["components"] = map[string]any{"x": map[string]any{"kind": "teapot"}}
		}), 400, apiv1.CodeInvalidSpec, "components.x"},
		{"volume with two targets", specJSON(func(m map[string]any) {
			m["disks"] = []any{map[string]any{"name": "v", "backend": map[string]any{"kind": "volume", "targets": []string{"127.0.0.1:1", "127.0.0.1:2"},
				"region": map[string]any{"block_size": 4096, "extent_blocks": 8, "extent_count": 2}, "gen": 1}}}
		}), 400, apiv1.CodeInvalidSpec, "targets"},
		{"oversized body", append([]byte(`{"name":"`), append(bytes.Repeat([]byte("x"), apiv1.MaxBodyBytes+1), '"', '}')...), 413, apiv1.CodeBodyTooLarge, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.EnsureRaw(ctx, tc.body)
			e := wantCode(t, err, tc.status, tc.code)
			if e.Body.Message == "" {
				t.Fatalf("no message: %+v", e.Body)
			}
			if tc.problem != "" && !strings.Contains(strings.Join(e.Body.Problems, "\n"), tc.problem) {
				t.Fatalf("problems %q; want one about %s", e.Body.Problems, tc.problem)
			}
		})
	}
	// Every problem at once.
	_, err := c.EnsureRaw(ctx, specJSON(func(m map[string]any) {
		m["memory_mib"] = 0
		m["vcpus"] = 0
		m["disks"] = []any{fileDisk("a"), fileDisk("a")}
	}))
	if e := wantCode(t, err, 400, apiv1.CodeInvalidSpec); len(e.Body.Problems) < 3 {
		t.Fatalf("problems %q; want each of memory, vcpus and the duplicate disk", e.Body.Problems)
	}
	for _, body := range []string{`{"requested":"dance"}`, `{"requested":"run","extra":1}`, `"run"`} {
		resp, err := p.raw.Post(p.url+"/v1/instance/state", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusMethodNotAllowed {
			t.Fatalf("POST state: %d; want 405", resp.StatusCode)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, p.url+"/v1/instance/state", strings.NewReader(body))
		resp, err = p.raw.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e apiv1.Error
		json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest || e.ErrorCode != apiv1.CodeMalformed {
			t.Fatalf("PUT state %s: %d %+v; want 400 %s", body, resp.StatusCode, e, apiv1.CodeMalformed)
		}
	}
	if err := c.RequestState(ctx, apiv1.Run); !client.IsCode(err, apiv1.CodeNoInstance) {
		t.Fatalf("run with no instance: %v; want 404 no_instance", err)
	}
	if _, err := c.Get(ctx); !client.IsCode(err, apiv1.CodeNoInstance) {
		t.Fatalf("after the bad ensures: %v; want still no instance", err)
	}
}

// TestATripleFaultFailsTheInstanceWithItsCrashReport runs hello with
// hello_fault 6 (a triple fault at CPL0) through the API: the instance
// fails, and its error, as GET /v1/instance returns it, carries the
// crash report after the cause.
func TestATripleFaultFailsTheInstanceWithItsCrashReport(t *testing.T) {
	p := startVMM(t, "")
	c, ctx := p.client, ctx(t)
	spec := apiv1.Spec{ID: "crash", Name: "hello", VCPUs: 1, MemoryMiB: 64,
		Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "hello", Params: map[string]uint64{"hello_fault": guests.HelloFaultTriple}},
		Init:  apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	if _, err := c.Ensure(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Failed }); err != nil {
		t.Fatalf("waiting for the instance to fail: %v", err)
	}
	v, err := c.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The empty IDT the guest loaded, or, on AMD SVM (the emulated test
	// host), the report's word that KVM reset the vCPU first.
	idt := "idt=0x0/0x0"
	if strings.Contains(v.Error, "reset by KVM before it reported the shutdown") {
		idt = "cs=0xf000"
	}
	for _, want := range []string{"triple-faulted (KVM_EXIT_SHUTDOWN)", "crash report:", "history:", "booted", "vCPU 0: mp=", idt, "last exits:"} {
		if !strings.Contains(v.Error, want) {
			t.Errorf("the instance's error lacks %q:\n%s", want, v.Error)
		}
	}
}
