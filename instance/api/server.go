package api

import (
	"bytes"
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"
	"github.com/quic-go/quic-go"

	"tern/instance"
	"tern/instance/apiv1"
	"tern/internal/httpjson"
	"tern/internal/telemetry"
	"tern/migration"
	"tern/vmm/devices"
)

// ensureWaitTimeout bounds how long an ensure waits for an instance
// already published destroyed or failed to finish releasing what it built.
const ensureWaitTimeout = 30 * time.Second

// MonitorTimeout is the longest GET /v1/instance/state?after_gen=N waits
// before answering with the current snapshot.
const MonitorTimeout = 30 * time.Second

//go:embed openapi.json
var openAPIDoc []byte

// OpenAPI returns the OpenAPI 3 document the server serves.
func OpenAPI() []byte { return append([]byte(nil), openAPIDoc...) }

// Config is what NewServer needs.
type Config struct {
	// Host bounds what a spec may ask for.
	Host instance.Host
	// VolumeTLS is what volume disks' upstairs present; nil rejects
	// volume disks.
	VolumeTLS *tls.Config
	// NewMachine builds VMs; nil means instance.NewVMMachine.
	NewMachine instance.NewMachineFunc
	Logger     *slog.Logger
	// Metrics is the set /metrics serves; nil makes a private one.
	Metrics *metrics.Set
	// Build is what GET /v1/version reports as build.
	Build string
	// MigrationAddr is the migration endpoint GET /v1/instance reports;
	// empty when the process does not listen for migration.
	MigrationAddr string
	// MigrationVersions are the migration protocol versions offered and
	// reported (nil: migration.SupportedVersions).
	MigrationVersions []apiv1.MigrationVersion
	// APIURL is this server's own URL, which a migration target sends
	// its source for the source's serial watchers.
	APIURL string
	// SameHostSocketPrefix is where a migration source makes its memfd
	// hand-over socket (migration.SourceConfig.SameHostSocketPrefix); empty
	// refuses the same-host path.
	SameHostSocketPrefix string
}

// Server is the control API of one VMM process: at most one live
// instance at a time.
type Server struct {
	// Immutable after NewServer.
	cfg     Config
	log     *slog.Logger
	metrics *metrics.Set
	mux     *http.ServeMux
	routes  []string
	// ctx ends the websocket streams on Close.
	ctx    context.Context
	cancel context.CancelFunc

	mu sync.Mutex
	// cur is the live instance or, once it is gone, the last one (its
	// last snapshot keeps being served); nil before the first ensure.
	cur *instance.Controller
	// closed refuses ensures once Close began.
	closed bool
	// streams counts websocket handlers, waited for by Close.
	streams sync.WaitGroup

	watchMu sync.Mutex
	// watched is, per connection (remote address) that carried a
	// monitor answer, the gen that answer gave: DrainWatchers waits for
	// every one to reach the final gen.
	watched map[string]apiv1.ViewGen
	// watchChanged is closed and replaced whenever watched changes.
	watchChanged chan struct{}
}

// NewServer returns a server with no instance.
func NewServer(cfg Config) *Server {
	s := &Server{cfg: cfg, log: cfg.Logger, metrics: cfg.Metrics, mux: http.NewServeMux(),
		watched: map[string]apiv1.ViewGen{}, watchChanged: make(chan struct{})}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "api")
	if s.metrics == nil {
		s.metrics = metrics.NewSet()
	}
	s.cfg.Host.VolumeTLS = cfg.VolumeTLS != nil
	s.registerMetrics()
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.route("/v1/instance", map[string]http.HandlerFunc{"PUT": s.ensure, "GET": s.getInstance})
	s.route("/v1/instance/state", map[string]http.HandlerFunc{"PUT": s.putState, "GET": s.monitor})
	s.route("/v1/instance/disks/{name}", map[string]http.HandlerFunc{"GET": s.getDisk})
	s.route("/v1/instance/serial/history", map[string]http.HandlerFunc{"GET": s.serialHistory})
	s.route("/v1/instance/serial", map[string]http.HandlerFunc{"GET": s.serialStream})
	s.route("/v1/version", map[string]http.HandlerFunc{"GET": s.version})
	s.route("/openapi.json", map[string]http.HandlerFunc{"GET": s.openAPI})
	s.route("/metrics", map[string]http.HandlerFunc{"GET": telemetry.MetricsHandler(s.metrics).ServeHTTP})
	s.route("/healthz", map[string]http.HandlerFunc{"GET": s.healthz})
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, apiv1.Error{ErrorCode: apiv1.CodeNotFound, Message: "no route " + r.URL.Path})
	})
	return s
}

// registerMetrics adds the instance's gauges: its gen and a 0/1 gauge
// per state.
func (s *Server) registerMetrics() {
	snapshot := func() (apiv1.View, bool) {
		c := s.current()
		if c == nil {
			return apiv1.View{}, false
		}
		return c.Publisher().Current(), true
	}
	s.metrics.NewGauge("tern_instance_gen", func() float64 {
		snap, _ := snapshot()
		return float64(snap.Gen)
	})
	for _, st := range apiv1.AllStates() {
		s.metrics.NewGauge(fmt.Sprintf(`tern_instance_state{state=%q}`, st), func() float64 {
			if snap, ok := snapshot(); ok && snap.State == st {
				return 1
			}
			return 0
		})
	}
}

// Routes lists "METHOD path" for every route, sorted; the OpenAPI test
// checks the document against it.
func (s *Server) Routes() []string { return append([]string(nil), s.routes...) }

// route registers path with a handler per method; another method gets a
// JSON 405.
func (s *Server) route(path string, methods map[string]http.HandlerFunc) {
	allow := make([]string, 0, len(methods))
	for m := range methods {
		allow = append(allow, m)
		s.routes = append(s.routes, m+" "+path)
	}
	sort.Strings(allow)
	sort.Strings(s.routes)
	s.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		h, ok := methods[r.Method]
		if !ok {
			w.Header().Set("Allow", strings.Join(allow, ", "))
			writeError(w, http.StatusMethodNotAllowed, apiv1.Error{ErrorCode: apiv1.CodeMethod,
				Message: fmt.Sprintf("%s %s: allowed %s", r.Method, path, strings.Join(allow, ", "))})
			return
		}
		s.metrics.GetOrCreateCounter(fmt.Sprintf(`tern_api_requests_total{method=%q,route=%q}`, r.Method, path)).Inc()
		h(w, r)
	})
}

// ServeHTTP serves the API.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close stops the live instance, waits until it is destroyed (or ctx
// ends), and ends every serial stream.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	c := s.cur
	s.mu.Unlock()
	var err error
	if c != nil {
		c.Request(apiv1.Stop)
		select {
		case <-c.Done():
		case <-ctx.Done():
			if !gone(c) {
				err = fmt.Errorf("stopping instance: %w", ctx.Err())
			}
		}
	}
	s.cancel()
	s.streams.Wait()
	return err
}

// current returns the instance, live or last; nil before any ensure.
func (s *Server) current() *instance.Controller {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// readBody reads a size-limited body, answering 413 itself.
func readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, apiv1.MaxBodyBytes))
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, apiv1.Error{ErrorCode: apiv1.CodeBodyTooLarge,
			Message: fmt.Sprintf("request body is larger than %d bytes", apiv1.MaxBodyBytes)})
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeMalformed, Message: "reading body: " + err.Error()})
		return nil, false
	}
	return b, true
}

func (s *Server) ensure(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	spec, err := apiv1.DecodeSpec(body)
	if err != nil {
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeMalformed, Message: err.Error()})
		return
	}
	if err := instance.Validate(&spec, s.cfg.Host); err != nil {
		var problems []string
		for _, e := range unjoin(err) {
			problems = append(problems, strings.TrimPrefix(e.Error(), instance.ErrInvalidSpec.Error()+": "))
		}
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeInvalidSpec,
			Message: fmt.Sprintf("%s: %s", instance.ErrInvalidSpec, strings.Join(problems, "; ")), Problems: problems})
		return
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, apiv1.Error{ErrorCode: apiv1.CodeShuttingDown, Message: "the server is shutting down"})
		return
	}
	if c := s.cur; c != nil && !gone(c) && ended(c) {
		// Destroyed or failed is published a moment before the owner
		// goroutine ends: once a watcher can see it, a new ensure is
		// accepted, after that moment.
		s.mu.Unlock()
		if !s.awaitEnd(r.Context(), c) {
			writeError(w, http.StatusServiceUnavailable, apiv1.Error{ErrorCode: apiv1.CodeShuttingDown,
				Message: fmt.Sprintf("instance %q is %s but has not finished releasing its resources", c.Spec().ID, c.Publisher().Current().State)})
			return
		}
		s.ensureAgain(w, spec)
		return
	}
	s.ensureLocked(w, spec)
}

// ensureAgain is the ensure's second look, once the last instance ended.
func (s *Server) ensureAgain(w http.ResponseWriter, spec apiv1.Spec) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		writeError(w, http.StatusServiceUnavailable, apiv1.Error{ErrorCode: apiv1.CodeShuttingDown, Message: "the server is shutting down"})
		return
	}
	s.ensureLocked(w, spec)
}

// ensureLocked, called with s.mu held, answers an ensure of spec against
// the current instance, starting a new one when the last is gone; it
// unlocks s.mu.
func (s *Server) ensureLocked(w http.ResponseWriter, spec apiv1.Spec) {
	if c := s.cur; c != nil && !gone(c) {
		s.mu.Unlock()
		switch {
		case c.Spec().ID != spec.ID:
			writeError(w, http.StatusConflict, apiv1.Error{ErrorCode: apiv1.CodeConflict,
				Message: fmt.Sprintf("instance %q exists; stop it before ensuring %q", c.Spec().ID, spec.ID)})
		case !c.Spec().Equal(spec):
			writeError(w, http.StatusConflict, apiv1.Error{ErrorCode: apiv1.CodeSpecMismatch,
				Message: fmt.Sprintf("instance %q exists with another spec", spec.ID)})
		default: // the same ensure again
			httpjson.Write(w, http.StatusCreated, s.view(c))
		}
		return
	}
	var firstGen apiv1.ViewGen
	if s.cur != nil {
		firstGen = s.cur.Publisher().Current().Gen + 1
	}
	c := instance.Start(instance.Config{
		Spec: spec, VolumeTLS: s.cfg.VolumeTLS, NewMachine: s.cfg.NewMachine, Logger: s.cfg.Logger, FirstGen: firstGen,
		Host: s.cfg.Host, MigrationTLS: s.cfg.VolumeTLS, MigrationVersions: s.cfg.MigrationVersions,
		APIURL: s.cfg.APIURL, SameHostSocketPrefix: s.cfg.SameHostSocketPrefix,
	})
	s.cur = c
	s.mu.Unlock()
	s.metrics.GetOrCreateCounter("tern_instance_ensures_total").Inc()
	s.log.Info("instance ensured", "id", spec.ID)
	httpjson.Write(w, http.StatusCreated, s.view(c))
}

// awaitEnd waits, bounded, for c, published destroyed or failed, to end;
// false if it did not.
func (s *Server) awaitEnd(ctx context.Context, c *instance.Controller) bool {
	s.log.Debug("ensure waits for the last instance to end", "id", c.Spec().ID)
	t := time.NewTimer(ensureWaitTimeout)
	defer t.Stop()
	select {
	case <-c.Done():
		return true
	case <-ctx.Done():
	case <-t.C:
	}
	return false
}

// ended reports whether c has published destroyed or failed: nothing but
// freeing what it built (already done) and ending its goroutine is left.
func ended(c *instance.Controller) bool {
	st := c.Publisher().Current().State
	return st == apiv1.Destroyed || st == apiv1.Failed
}

// gone reports whether c is destroyed or failed with everything freed.
func gone(c *instance.Controller) bool {
	select {
	case <-c.Done():
		return true
	default:
		return false
	}
}

// unjoin flattens errors.Join.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

func (s *Server) view(c *instance.Controller) apiv1.Instance {
	snap := c.Publisher().Current()
	v := apiv1.Instance{ID: c.Spec().ID, State: snap.State, Gen: snap.Gen, Spec: c.BuiltSpec(), Disks: c.Disks(),
		Migration: snap.Migration, MigrationAddr: s.cfg.MigrationAddr}
	if err := c.Failure(); err != nil {
		v.Error = err.Error()
	}
	v.StopReason = c.StopReason()
	return v
}

// instanceOr404 returns the instance or answers 404 no_instance.
func (s *Server) instanceOr404(w http.ResponseWriter) *instance.Controller {
	c := s.current()
	if c == nil {
		writeError(w, http.StatusNotFound, apiv1.Error{ErrorCode: apiv1.CodeNoInstance, Message: "no instance has been ensured"})
	}
	return c
}

func (s *Server) getInstance(w http.ResponseWriter, r *http.Request) {
	if c := s.instanceOr404(w); c != nil {
		httpjson.Write(w, http.StatusOK, s.view(c))
	}
}

func (s *Server) putState(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r)
	if !ok {
		return
	}
	var req apiv1.StateRequest
	if err := httpjson.Decode(bytes.NewReader(body), &req); err != nil {
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeMalformed,
			Message: "parsing state request: " + err.Error() + ` (want {"requested":"run"|"stop"|"reboot"})`})
		return
	}
	switch req.Requested {
	case apiv1.Run, apiv1.Stop, apiv1.Reboot:
	default:
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeMalformed,
			Message: fmt.Sprintf(`requested %q: want "run", "stop" or "reboot"`, req.Requested)})
		return
	}
	c := s.instanceOr404(w)
	if c == nil {
		return
	}
	if _, err := c.Request(req.Requested); err != nil {
		var ws *instance.WrongStateError
		if errors.As(err, &ws) {
			st := ws.State
			writeError(w, http.StatusConflict, apiv1.Error{ErrorCode: apiv1.CodeWrongState, Message: err.Error(), State: &st})
			return
		}
		writeError(w, http.StatusInternalServerError, apiv1.Error{ErrorCode: apiv1.CodeInternalError, Message: err.Error()})
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) monitor(w http.ResponseWriter, r *http.Request) {
	gen, ok := httpjson.AfterGen(r)
	if !ok {
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeMalformed, Message: fmt.Sprintf("after_gen %q: not a gen", r.URL.Query().Get("after_gen"))})
		return
	}
	after := apiv1.ViewGen(gen)
	c := s.instanceOr404(w)
	if c == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), MonitorTimeout)
	defer cancel()
	snap, err := c.Publisher().WaitAfter(ctx, after)
	switch {
	case errors.Is(err, instance.ErrGone):
		s.noteWatcher(r.RemoteAddr, math.MaxUint64)
		writeError(w, http.StatusGone, apiv1.Error{ErrorCode: apiv1.CodeInstanceGone,
			Message: fmt.Sprintf("instance %q is gone; its last gen is %d", c.Spec().ID, c.Publisher().Current().Gen)})
	case err != nil && r.Context().Err() != nil:
		// The client left.
	case err != nil: // the 30 s passed: the current snapshot; the client asks again
		cur := c.Publisher().Current()
		s.noteWatcher(r.RemoteAddr, cur.Gen)
		httpjson.Write(w, http.StatusOK, cur)
	default:
		s.noteWatcher(r.RemoteAddr, snap.Gen)
		httpjson.Write(w, http.StatusOK, snap)
	}
}

// noteWatcher records that the connection from addr was answered with gen.
func (s *Server) noteWatcher(addr string, gen apiv1.ViewGen) {
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	s.watched[addr] = gen
	close(s.watchChanged)
	s.watchChanged = make(chan struct{})
}

// ConnState is for http.Server.ConnState: it forgets the watchers of
// connections that closed.
func (s *Server) ConnState(c net.Conn, st http.ConnState) {
	if st != http.StateClosed && st != http.StateHijacked {
		return
	}
	addr := c.RemoteAddr().String()
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if _, ok := s.watched[addr]; ok {
		delete(s.watched, addr)
		close(s.watchChanged)
		s.watchChanged = make(chan struct{})
	}
}

// DrainWatchers waits until every open connection that carried a monitor
// answer has been given the last instance's final snapshot (or a 410), or
// until ctx ends. After Close, it lets a watcher that was between two
// long-polls fetch destroyed before the listener goes; it needs
// ConnState installed to forget connections that close.
func (s *Server) DrainWatchers(ctx context.Context) error {
	c := s.current()
	if c == nil {
		return nil
	}
	final := c.Publisher().Current().Gen
	for {
		s.watchMu.Lock()
		behind := 0
		for _, gen := range s.watched {
			if gen < final {
				behind++
			}
		}
		changed := s.watchChanged
		s.watchMu.Unlock()
		if behind == 0 {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("%d watchers still behind gen %d: %w", behind, final, ctx.Err())
		}
	}
}

func (s *Server) getDisk(w http.ResponseWriter, r *http.Request) {
	c := s.instanceOr404(w)
	if c == nil {
		return
	}
	name := r.PathValue("name")
	d, ok := c.Disk(name)
	if !ok {
		writeError(w, http.StatusNotFound, apiv1.Error{ErrorCode: apiv1.CodeNoSuchDisk, Message: fmt.Sprintf("instance has no disk %q", name)})
		return
	}
	httpjson.Write(w, http.StatusOK, d)
}

func (s *Server) serialHistory(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	from, err := uintParam(q.Get("from_offset"), 0)
	if err != nil {
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeMalformed, Message: "from_offset: " + err.Error()})
		return
	}
	maxBytes, err := uintParam(q.Get("max_bytes"), apiv1.DefaultSerialMaxBytes)
	if err != nil || maxBytes == 0 || maxBytes > apiv1.MaxSerialMaxBytes {
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeMalformed,
			Message: fmt.Sprintf("max_bytes %q: want 1 to %d", q.Get("max_bytes"), apiv1.MaxSerialMaxBytes)})
		return
	}
	c := s.instanceOr404(w)
	if c == nil {
		return
	}
	data, first, next, err := c.Console().ReadFrom(from, int(maxBytes))
	if errors.Is(err, devices.ErrOffsetAhead) {
		_, end := c.Console().Bounds()
		writeError(w, http.StatusBadRequest, apiv1.Error{ErrorCode: apiv1.CodeOffsetAhead,
			Message: fmt.Sprintf("from_offset %d is past the end of the console (%d)", from, end)})
		return
	}
	httpjson.Write(w, http.StatusOK, apiv1.SerialHistory{Data: strings.ToValidUTF8(string(data), "\uFFFD"), FromOffset: first, NextOffset: next})
}

func uintParam(v string, def uint64) (uint64, error) {
	if v == "" {
		return def, nil
	}
	return strconv.ParseUint(v, 10, 64)
}

func (s *Server) version(w http.ResponseWriter, r *http.Request) {
	httpjson.Write(w, http.StatusOK, apiv1.Version{Build: s.cfg.Build, MigrationProtocols: s.migrationVersions(), Devices: migration.DeviceVersions()})
}

func (s *Server) migrationVersions() []apiv1.MigrationVersion {
	if s.cfg.MigrationVersions != nil {
		return s.cfg.MigrationVersions
	}
	return migration.SupportedVersions
}

// AcceptMigration hands a migration connection a target dialed to the
// live instance, whose request policy decides; with no live instance the
// connection is closed with the reason.
func (s *Server) AcceptMigration(conn *quic.Conn) {
	s.mu.Lock()
	c, closed := s.cur, s.closed
	s.mu.Unlock()
	var err error
	switch {
	case closed:
		err = errors.New("the source VMM is shutting down")
	case c == nil || gone(c):
		err = errors.New("the source VMM has no live instance")
	default:
		err = c.AcceptMigration(conn) // closes conn itself when denied
		if err != nil {
			s.log.Warn("migration out refused", "peer", conn.RemoteAddr().String(), "err", err)
		}
		return
	}
	s.log.Warn("migration out refused", "peer", conn.RemoteAddr().String(), "err", err)
	conn.CloseWithError(6, err.Error())
}

func (s *Server) openAPI(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write(openAPIDoc)
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	httpjson.Write(w, http.StatusOK, map[string]string{"status": "ok"})
}

// writeError answers with status and e, the vmm API's error body
// (httpjson's, with the state and problems beside).
func writeError(w http.ResponseWriter, status int, e apiv1.Error) { httpjson.Write(w, status, e) }
