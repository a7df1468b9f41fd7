package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"tern/instance"
	"tern/instance/api"
	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/testwait"
	"tern/vmm/devices"
)

// fakeMachine stands in for a KVM VM so the controller and API run under
// the race detector with no /dev/kvm: Run prints a line and waits for
// Stop; input is echoed.
type fakeMachine struct {
	out    *devices.History
	stop   chan struct{}
	once   sync.Once
	closed atomic.Bool
	exit   chan uint32 // the guest exits with this status
}

func (m *fakeMachine) Run(ctx context.Context) (uint32, error) {
	m.out.Write([]byte("fake: up\r\n"))
	select {
	case <-m.stop:
		return 0, errors.New("VM stopped")
	case s := <-m.exit:
		return s, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
func (m *fakeMachine) Stop()                          { m.once.Do(func() { close(m.stop) }) }
func (m *fakeMachine) Close() error                   { m.closed.Store(true); return nil }
func (m *fakeMachine) SerialOutput() *devices.History { return m.out }
func (m *fakeMachine) SerialInput(p []byte) int       { m.out.Write(p); return len(p) }

// machines builds fake machines, optionally held at a gate, and records
// them.
type machines struct {
	mu    sync.Mutex
	all   []*fakeMachine
	gate  chan struct{} // nil: no wait
	fail  error
	built chan struct{} // one value per machine built
}

func (f *machines) new(cfg instance.MachineConfig) (instance.Machine, error) {
	if f.gate != nil {
		<-f.gate
	}
	if f.fail != nil {
		return nil, f.fail
	}
	m := &fakeMachine{out: devices.NewHistory(4096), stop: make(chan struct{}), exit: make(chan uint32, 1)}
	f.mu.Lock()
	f.all = append(f.all, m)
	f.mu.Unlock()
	if f.built != nil {
		f.built <- struct{}{}
	}
	return m, nil
}

func (f *machines) allClosed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range f.all {
		if !m.closed.Load() {
			return false
		}
	}
	return true
}

type harness struct {
	srv *api.Server
	c   *client.Client
	ctx context.Context
}

func newHarness(t *testing.T, f *machines) *harness {
	t.Helper()
	before := testwait.Running()
	srv := api.NewServer(api.Config{Host: instance.Host{MaxVCPUs: 4}, NewMachine: f.new})
	hs := httptest.NewServer(srv)
	c, err := client.New(hs.URL, hs.Client())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(func() {
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if err := srv.Close(cctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		hs.Close()
		cancel()
		if !f.allClosed() {
			t.Error("a machine was left open")
		}
		// Every goroutine the server and its instances started ends.
		before.Returned(t, time.Minute)
	})
	return &harness{srv: srv, c: c, ctx: ctx}
}

func spec(id string) apiv1.Spec {
	return apiv1.Spec{ID: id, VCPUs: 1, MemoryMiB: 64, Guest: apiv1.GuestSpec{Kind: "elf", Path: "echo"},
		Init: apiv1.InitSpec{Method: "spec"}}
}

func TestOpenAPIDocumentNamesExactlyTheServedRoutes(t *testing.T) {
	var doc struct {
		OpenAPI string                    `json:"openapi"`
		Paths   map[string]map[string]any `json:"paths"`
	}
	if err := json.Unmarshal(api.OpenAPI(), &doc); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Fatalf("openapi %q; want 3.x", doc.OpenAPI)
	}
	var documented []string
	for path, ops := range doc.Paths {
		for method := range ops {
			documented = append(documented, strings.ToUpper(method)+" "+path)
		}
	}
	slices.Sort(documented)
	srv := api.NewServer(api.Config{})
	defer srv.Close(context.Background())
	if got := srv.Routes(); !slices.Equal(got, documented) {
		t.Fatalf("served routes %q\ndocumented %q", got, documented)
	}
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "/openapi.json", nil))
	if rec.Code != 200 || !bytes.Equal(rec.Body.Bytes(), api.OpenAPI()) {
		t.Fatalf("GET /openapi.json: %d", rec.Code)
	}
}

func TestStopWhileBuildingMemoryDestroysWithoutRunning(t *testing.T) {
	f := &machines{gate: make(chan struct{})}
	h := newHarness(t, f)
	if _, err := h.c.Ensure(h.ctx, spec("gated")); err != nil {
		t.Fatal(err)
	}
	if err := h.c.RequestState(h.ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	err := h.c.RequestState(h.ctx, apiv1.Reboot)
	var e *client.APIError
	if !errors.As(err, &e) || e.Status != 409 || e.Body.ErrorCode != apiv1.CodeWrongState || *e.Body.State != apiv1.Creating {
		t.Fatalf("reboot while creating: %v", err)
	}
	if err := h.c.RequestState(h.ctx, apiv1.Stop); err != nil {
		t.Fatal(err)
	}
	close(f.gate) // the memory is built; the stop is seen next
	s, err := h.c.WaitFor(h.ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed })
	if err != nil {
		t.Fatal(err)
	}
	if hist, _ := h.c.SerialHistory(h.ctx, 0, 0); hist.Data != "" {
		t.Fatalf("the guest ran: console %q", hist.Data)
	}
	if v, _ := h.c.Get(h.ctx); v.State != apiv1.Destroyed || v.Gen != s.Gen {
		t.Fatalf("GET after destroyed: %+v", v)
	}
}

func TestFailedBuildEndsFailedAndANewEnsureIsAccepted(t *testing.T) {
	f := &machines{fail: errors.New("no memory for you")}
	h := newHarness(t, f)
	if _, err := h.c.Ensure(h.ctx, spec("doomed")); err != nil {
		t.Fatal(err)
	}
	last, err := h.c.WaitFor(h.ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Failed })
	if err != nil {
		t.Fatal(err)
	}
	v, err := h.c.Get(h.ctx)
	if err != nil || v.State != apiv1.Failed || !strings.Contains(v.Error, "no memory for you") {
		t.Fatalf("GET: %+v, %v", v, err)
	}
	if _, err := h.c.Monitor(h.ctx, last.Gen); !client.IsCode(err, apiv1.CodeInstanceGone) {
		t.Fatalf("monitor past failed: %v; want 410", err)
	}
	f.fail = nil // only the owner goroutine of the next instance reads it
	v, err = h.c.Ensure(h.ctx, spec("next"))
	if err != nil || v.Gen <= last.Gen || v.ID != "next" {
		t.Fatalf("ensure after failed: %+v, %v", v, err)
	}
}

func TestGuestExitHaltsTheInstance(t *testing.T) {
	f := &machines{built: make(chan struct{}, 1)}
	h := newHarness(t, f)
	if _, err := h.c.Ensure(h.ctx, spec("exits")); err != nil {
		t.Fatal(err)
	}
	<-f.built
	if err := h.c.RequestState(h.ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.WaitFor(h.ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Running }); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.all[0].exit <- 0
	f.mu.Unlock()
	if _, err := h.c.WaitFor(h.ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentRequestsKeepGensIncreasingAndEndDestroyed throws run,
// reboot and stop at an instance from many goroutines: every answer is
// 204 or 409 wrong_state, the controller's Pending contract holds (it
// panics otherwise), gens seen by a watcher strictly increase, and the
// instance ends destroyed.
func TestConcurrentRequestsKeepGensIncreasingAndEndDestroyed(t *testing.T) {
	f := &machines{}
	h := newHarness(t, f)
	if _, err := h.c.Ensure(h.ctx, spec("busy")); err != nil {
		t.Fatal(err)
	}
	watched := make(chan []apiv1.ViewGen, 1)
	go func() {
		var gens []apiv1.ViewGen
		h.c.WaitFor(h.ctx, 0, func(s apiv1.View) bool {
			gens = append(gens, s.Gen)
			return s.State == apiv1.Destroyed
		})
		watched <- gens
	}()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for j := range 20 {
				req := []apiv1.Request{apiv1.Run, apiv1.Reboot, apiv1.Run}[(i+j)%3]
				if err := h.c.RequestState(h.ctx, req); err != nil && !client.IsCode(err, apiv1.CodeWrongState) {
					t.Errorf("%s: %v", req, err)
				}
			}
		})
	}
	wg.Wait()
	if err := h.c.RequestState(h.ctx, apiv1.Stop); err != nil {
		t.Fatal(err)
	}
	gens := <-watched
	for i := 1; i < len(gens); i++ {
		if gens[i] <= gens[i-1] {
			t.Fatalf("gens %v not strictly increasing", gens)
		}
	}
	if v, _ := h.c.Get(h.ctx); v.State != apiv1.Destroyed {
		t.Fatalf("final state %s", v.State)
	}
	rec := httptest.NewRecorder()
	h.srv.ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`tern_instance_state{state="destroyed"} 1`, `tern_instance_state{state="running"} 0`,
		"tern_instance_ensures_total 1", "tern_instance_gen "} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

func TestEveryErrorIsJSONWithACode(t *testing.T) {
	h := newHarness(t, &machines{})
	srv := h.srv
	for _, tc := range []struct {
		method, path, body string
		status             int
		code               string
	}{
		{"GET", "/v1/instance", "", 404, apiv1.CodeNoInstance},
		{"GET", "/v1/instance/state?after_gen=x", "", 400, apiv1.CodeMalformed},
		{"GET", "/v1/instance/state", "", 404, apiv1.CodeNoInstance},
		{"GET", "/v1/instance/disks/a", "", 404, apiv1.CodeNoInstance},
		{"GET", "/v1/instance/serial/history?max_bytes=0", "", 400, apiv1.CodeMalformed},
		{"DELETE", "/v1/instance", "", 405, apiv1.CodeMethod},
		{"GET", "/v2/nothing", "", 404, apiv1.CodeNotFound},
		{"PUT", "/v1/instance/state", `{"requested":"migrate_out"}`, 400, apiv1.CodeMalformed},
		{"PUT", "/v1/instance", strings.Repeat(" ", apiv1.MaxBodyBytes+1), 413, apiv1.CodeBodyTooLarge},
	} {
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, strings.NewReader(tc.body)))
		var e apiv1.Error
		if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || rec.Code != tc.status || e.ErrorCode != tc.code || e.Message == "" {
			t.Errorf("%s %s: %d %s; want %d %s", tc.method, tc.path, rec.Code, rec.Body, tc.status, tc.code)
		}
		if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: content type %q", tc.method, tc.path, ct)
		}
	}
}

// TestSerialWebsocketReplaysTypesAndClosesWhenGone drives the console
// websocket in-process under the race detector.
func TestSerialWebsocketReplaysTypesAndClosesWhenGone(t *testing.T) {
	f := &machines{}
	h := newHarness(t, f)
	if _, err := h.c.Ensure(h.ctx, spec("ws")); err != nil {
		t.Fatal(err)
	}
	if err := h.c.RequestState(h.ctx, apiv1.Run); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.WaitFor(h.ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Running }); err != nil {
		t.Fatal(err)
	}
	conn, err := h.c.Serial(h.ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var got strings.Builder
	readUntil := func(want string) {
		for !strings.Contains(got.String(), want) {
			_, msg, err := conn.Read(h.ctx)
			if err != nil {
				t.Fatalf("reading for %q: %v (got %q)", want, err, got.String())
			}
			got.Write(msg)
		}
	}
	readUntil("fake: up\r\n")
	if err := conn.Write(h.ctx, websocket.MessageBinary, []byte("typed")); err != nil {
		t.Fatal(err)
	}
	readUntil("typed")
	if err := h.c.RequestState(h.ctx, apiv1.Stop); err != nil {
		t.Fatal(err)
	}
	for {
		if _, _, err := conn.Read(h.ctx); err != nil {
			if websocket.CloseStatus(err) != websocket.StatusNormalClosure {
				t.Fatalf("after stop: %v; want a normal close", err)
			}
			break
		}
	}
}

// destroyedGate is a log handler that holds the controller's owner
// goroutine at its "destroyed" log line, just after destroyed is
// published and before the goroutine ends, until the server says an
// ensure waits for it: it widens the moment between the two to forever.
type destroyedGate struct {
	mu   sync.Mutex
	gate chan struct{}
}

func newDestroyedGate() *destroyedGate { return &destroyedGate{gate: make(chan struct{})} }

func (g *destroyedGate) Enabled(context.Context, slog.Level) bool { return true }
func (g *destroyedGate) WithAttrs([]slog.Attr) slog.Handler       { return g }
func (g *destroyedGate) WithGroup(string) slog.Handler            { return g }
func (g *destroyedGate) Handle(_ context.Context, r slog.Record) error {
	switch r.Message {
	case "instance state":
		destroyed := false
		r.Attrs(func(a slog.Attr) bool {
			destroyed = destroyed || (a.Key == "state" && a.Value.String() == "destroyed")
			return true
		})
		if destroyed {
			g.mu.Lock()
			gate := g.gate
			g.mu.Unlock()
			<-gate
		}
	case "ensure waits for the last instance to end":
		g.release()
	}
	return nil
}

// release lets the held goroutine go and arms a fresh gate.
func (g *destroyedGate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.gate)
	g.gate = make(chan struct{})
}

// TestEnsureIsAcceptedAsSoonAsDestroyedIsObserved ensures, stops and,
// the moment the monitor shows destroyed (the old owner goroutine held
// right after publishing it), ensures another instance: every ensure
// gets 201, never instance_exists.
func TestEnsureIsAcceptedAsSoonAsDestroyedIsObserved(t *testing.T) {
	f := &machines{}
	g := newDestroyedGate()
	srv := api.NewServer(api.Config{Host: instance.Host{MaxVCPUs: 1}, NewMachine: f.new, Logger: slog.New(g)})
	hs := httptest.NewServer(srv)
	c, err := client.New(hs.URL, hs.Client())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	t.Cleanup(func() {
		g.release() // should the ensure have been refused, the goroutine is still held
		cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
		defer ccancel()
		if err := srv.Close(cctx); err != nil {
			t.Errorf("Close: %v", err)
		}
		hs.Close()
	})
	for i := range 5 {
		v, err := c.Ensure(ctx, spec(fmt.Sprintf("again-%d", i)))
		if err != nil {
			t.Fatalf("ensure %d, right after destroyed: %v", i, err)
		}
		if err := c.RequestState(ctx, apiv1.Stop); err != nil {
			t.Fatalf("stop %d: %v", i, err)
		}
		if _, err := c.WaitFor(ctx, v.Gen-1, func(s apiv1.View) bool { return s.State == apiv1.Destroyed }); err != nil {
			t.Fatalf("waiting for destroyed %d: %v", i, err)
		}
	}
}

// TestDrainWatchersWaitsForAWatcherBetweenTwoLongPolls: after Close, a
// watcher last answered with an earlier gen holds DrainWatchers until it
// asks again and gets destroyed; one whose connection closes no longer
// counts.
func TestDrainWatchersWaitsForAWatcherBetweenTwoLongPolls(t *testing.T) {
	f := &machines{}
	srv := api.NewServer(api.Config{Host: instance.Host{MaxVCPUs: 1}, NewMachine: f.new})
	hs := httptest.NewUnstartedServer(srv)
	hs.Config.ConnState = srv.ConnState
	hs.Start()
	defer hs.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	watcher, _ := client.New(hs.URL, hs.Client())
	v, err := watcher.Ensure(ctx, spec("drain"))
	if err != nil {
		t.Fatal(err)
	}
	first, err := watcher.Monitor(ctx, v.Gen-1)
	if err != nil {
		t.Fatal(err)
	}
	// Another watcher, on its own connection, that goes away behind.
	leaverTransport := hs.Client().Transport.(*http.Transport).Clone()
	leaver, _ := client.New(hs.URL, &http.Client{Transport: leaverTransport})
	if _, err := leaver.Monitor(ctx, v.Gen-1); err != nil {
		t.Fatal(err)
	}
	if err := srv.Close(ctx); err != nil {
		t.Fatal(err)
	}
	drained := make(chan error, 1)
	go func() { drained <- srv.DrainWatchers(ctx) }()
	last, err := watcher.WaitFor(ctx, first.Gen, func(s apiv1.View) bool { return s.State == apiv1.Destroyed })
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-drained:
		t.Fatalf("DrainWatchers returned %v with a watcher behind, before it closed its connection", err)
	default:
	}
	leaverTransport.CloseIdleConnections()
	if err := <-drained; err != nil {
		t.Fatalf("DrainWatchers after the watcher got gen %d and the other left: %v", last.Gen, err)
	}
}
