package control

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync"
	"syscall"
	"time"

	"tern/control/controlapi"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"tern/agent/agentapi"
	"tern/instance/apiv1"
	"tern/internal/httpjson"
)

// Config is a control process's configuration.
type Config struct {
	// URL is this process's API URL (what other members forward to).
	URL string
	// Etcd is the records' cluster; Root the key prefix ("/tern/").
	Etcd *clientv3.Client
	Root string
	// AgentHTTP is the client that reaches agents.
	AgentHTTP *http.Client
	Logger    *slog.Logger
	// CrashAt, for fault-injection tests, SIGKILLs the process at a saga
	// point: "before:STEP" (recorded, not acted) or "after:STEP" (acted,
	// not recorded done).
	CrashAt string
	// MaxParallelDrain is K, how many migrations a drain runs at once
	// (default 2).
	MaxParallelDrain int
}

// Server is one control-plane process: the API, and, while it leads,
// the sagas and drains.
type Server struct {
	cfg   Config
	store *Store
	log   *slog.Logger
	mux   *http.ServeMux
	ctx   context.Context
	stop  context.CancelFunc
	wg    sync.WaitGroup

	mu sync.Mutex
	// leader is whether this process leads; leaderURL the leader's URL
	// (guarded by mu).
	leader    bool
	leaderURL string
	// term is the context of this process's current leadership: sagas
	// and drains run under it and stop when leadership is lost (guarded
	// by mu; a cancelled context while not leading).
	term context.Context
	// leaderChanged is closed and replaced whenever leader or leaderURL
	// changes (guarded by mu), for GET /v1/leader's waits.
	leaderChanged chan struct{}
	// running holds the sagas and drains this process drives, so a
	// resume never starts one twice (guarded by mu).
	running map[string]bool
}

// NewServer returns a server; Run makes it campaign for leadership.
func NewServer(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.AgentHTTP == nil {
		cfg.AgentHTTP = &http.Client{Timeout: 3 * time.Minute}
	}
	if cfg.Root == "" {
		cfg.Root = "/tern/"
	}
	if cfg.MaxParallelDrain <= 0 {
		cfg.MaxParallelDrain = 2
	}
	ctx, stop := context.WithCancel(context.Background())
	notLeading, cancel := context.WithCancel(ctx)
	cancel()
	s := &Server{cfg: cfg, store: NewStore(cfg.Etcd, cfg.Root), log: cfg.Logger.With("component", "control"),
		ctx: ctx, stop: stop, running: map[string]bool{}, term: notLeading, leaderChanged: make(chan struct{})}
	s.routes()
	return s
}

// sessionTTL is the leadership lease's time to live, in seconds: how
// long a dead leader's lease outlives it before another process leads.
const sessionTTL = 5

// campaignRetry bounds the pause before campaigning again after the
// session to etcd was lost or could not be opened.
const campaignRetry = time.Second

// Run campaigns for leadership until ctx ends: once leader it resumes
// every saga and drain in flight and leads until its etcd session is
// lost (etcd lost its quorum, or this process could not reach it for
// the lease's TTL); then it stops what it drove and campaigns again.
func (s *Server) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		// Close ends the server's context; leadership ends with it.
		select {
		case <-s.ctx.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	for {
		err := s.leadOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		s.log.Warn("not leading the control plane", "err", err)
		select {
		case <-time.After(campaignRetry):
		case <-ctx.Done():
			return nil
		}
	}
}

// leadOnce opens a session, campaigns, and leads until the session ends.
func (s *Server) leadOnce(ctx context.Context) error {
	sess, err := concurrency.NewSession(s.cfg.Etcd, concurrency.WithTTL(sessionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("opening an etcd session: %w", err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, s.cfg.Root+"leader")
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	go s.followLeader(octx, el)
	cctx, stopCampaign := context.WithCancel(ctx)
	defer stopCampaign()
	go func() {
		select {
		case <-sess.Done():
			stopCampaign()
		case <-cctx.Done():
		}
	}()
	if err := el.Campaign(cctx, s.cfg.URL); err != nil {
		return fmt.Errorf("campaigning for leadership: %w", err)
	}
	term, endTerm := context.WithCancel(ctx)
	s.store.fence(el.Key(), el.Rev())
	s.setLeader(true, s.cfg.URL, term)
	s.log.Info("leading the control plane", "url", s.cfg.URL)
	s.resume()
	select {
	case <-ctx.Done():
		err = nil
	case <-sess.Done():
		err = errors.New("lost the etcd session: no longer leader")
	}
	endTerm()
	s.store.fence("", 0)
	s.setLeader(false, "", term)
	// What this term started stops before another campaign: a next term
	// resumes it from the records.
	s.wg.Wait()
	return err
}

// setLeader records who leads and wakes the waiters of GET /v1/leader.
func (s *Server) setLeader(leader bool, url string, term context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.leader, s.leaderURL, s.term = leader, url, term
	close(s.leaderChanged)
	s.leaderChanged = make(chan struct{})
}

// termCtx is the context of the current leadership term (cancelled when
// not leading).
func (s *Server) termCtx() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.term
}

// followLeader keeps leaderURL current for forwarding.
func (s *Server) followLeader(ctx context.Context, el *concurrency.Election) {
	for resp := range el.Observe(ctx) {
		if len(resp.Kvs) > 0 {
			s.mu.Lock()
			if !s.leader {
				s.leaderURL = string(resp.Kvs[0].Value)
				close(s.leaderChanged)
				s.leaderChanged = make(chan struct{})
			}
			s.mu.Unlock()
		}
	}
}

// Close stops the sagas and drains this process drives (they resume
// from their records in the next leader).
func (s *Server) Close() {
	s.stop()
	s.wg.Wait()
}

// ServeHTTP serves the API: reads here, writes at the leader (forwarded
// when another process leads).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		leader, to := s.awaitLeader(r.Context())
		if !leader {
			if to == "" || to == s.cfg.URL {
				httpjson.WriteError(w, http.StatusServiceUnavailable, "no_leader",
					"no control process leads: none has won the election in etcd yet (is a quorum of its members up?); retry")
				return
			}
			u, err := url.Parse(to)
			if err != nil {
				httpjson.WriteError(w, http.StatusServiceUnavailable, "no_leader", "bad leader URL "+to)
				return
			}
			httputil.NewSingleHostReverseProxy(u).ServeHTTP(w, r)
			return
		}
	}
	s.mux.ServeHTTP(w, r)
}

// forwardWait bounds how long a write waits for some process to lead
// (an election in progress, or this process not yet having seen its
// winner) before it is refused with no_leader.
const forwardWait = 15 * time.Second

// awaitLeader returns whether this process leads and, if not, the
// leader's URL, waiting up to forwardWait for one to be known.
func (s *Server) awaitLeader(ctx context.Context) (bool, string) {
	ctx, cancel := context.WithTimeout(ctx, forwardWait)
	defer cancel()
	for {
		s.mu.Lock()
		leader, to, changed := s.leader, s.leaderURL, s.leaderChanged
		s.mu.Unlock()
		if leader || to != "" && to != s.cfg.URL {
			return leader, to
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return leader, to
		}
	}
}

// crashPoint SIGKILLs the process when CrashAt names this point.
func (s *Server) crashPoint(point string) {
	if s.cfg.CrashAt != "" && s.cfg.CrashAt == point {
		s.log.Warn("fault injection: SIGKILL", "at", point)
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// agentFor returns a client for host id's agent.
func (s *Server) agentFor(ctx context.Context, id string) (*agentapi.Client, error) {
	h, err := Get[controlapi.Host](ctx, s.store, kindHost, id)
	if err != nil {
		return nil, err
	}
	return agentapi.NewClient(h.Value.Address, s.cfg.AgentHTTP), nil
}

// loads returns every host's capacity and reservations from the records.
func (s *Server) loads(ctx context.Context) ([]HostLoad, error) {
	hosts, err := List[controlapi.Host](ctx, s.store, kindHost)
	if err != nil {
		return nil, err
	}
	vmms, err := List[controlapi.VMM](ctx, s.store, kindVMM)
	if err != nil {
		return nil, err
	}
	regions, err := List[controlapi.Region](ctx, s.store, kindRegion)
	if err != nil {
		return nil, err
	}
	var out []HostLoad
	for _, h := range hosts {
		l := HostLoad{ID: h.Value.ID, Active: h.Value.State == controlapi.HostActive, CPUs: h.Value.CPUs, MemoryMiB: h.Value.MemoryMiB}
		for _, v := range vmms {
			if v.Value.HostID == l.ID && v.Value.HoldsResources() {
				l.UsedCPUs += v.Value.VCPUs
				l.UsedMemory += v.Value.MemoryMiB
			}
		}
		for _, r := range regions {
			if r.Value.HostID == l.ID {
				l.RegionsCount++
			}
		}
		out = append(out, l)
	}
	return out, nil
}

// instanceState is the instance's state in the vmm's names.
func instanceState(inst *controlapi.Instance, active *controlapi.VMM) string {
	switch {
	case inst.MigrationID != "":
		return apiv1.Migrating.String()
	case active == nil && inst.Failed:
		return apiv1.Failed.String()
	case active == nil:
		return apiv1.Stopped.String()
	case active.Gone:
		return apiv1.Failed.String()
	case active.Gen == 0:
		return apiv1.Creating.String()
	}
	return active.State.String()
}

func (s *Server) instanceView(ctx context.Context, inst *controlapi.Instance) controlapi.InstanceView {
	v := controlapi.InstanceView{ID: inst.ID, Name: inst.Name, VCPUs: inst.VCPUs, MemoryMiB: inst.MemoryMiB, Intent: string(inst.Intent),
		MigrationID: inst.MigrationID, TargetVMM: inst.TargetVMM, Network: inst.Network, VMM: inst.ActiveVMM}
	if inst.Volume != nil {
		v.Regions = inst.Volume.Regions
	}
	var active *controlapi.VMM
	if inst.ActiveVMM != "" {
		if a, err := Get[controlapi.VMM](ctx, s.store, kindVMM, inst.ActiveVMM); err == nil {
			active = &a.Value
			v.Host = a.Value.HostID
		}
	}
	if inst.TargetVMM != "" {
		if t, err := Get[controlapi.VMM](ctx, s.store, kindVMM, inst.TargetVMM); err == nil {
			v.TargetHost = t.Value.HostID
		}
	}
	v.State = instanceState(inst, active)
	return v
}

// writeErr maps an error to its status.
func writeErr(w http.ResponseWriter, err error) {
	var nc *ErrNoCapacity
	var ae *apiErr
	switch {
	case errors.As(err, &ae):
		httpjson.WriteError(w, ae.status, ae.code, ae.Error())
	case errors.Is(err, ErrNotFound):
		httpjson.WriteError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.As(err, &nc):
		httpjson.WriteError(w, http.StatusConflict, "no_capacity", err.Error())
	case errors.Is(err, ErrConflict):
		httpjson.WriteError(w, http.StatusConflict, "conflict", err.Error())
	case errors.Is(err, ErrEtcdUnavailable):
		httpjson.WriteError(w, http.StatusServiceUnavailable, "etcd_unavailable", err.Error())
	case errors.Is(err, ErrNotLeader):
		httpjson.WriteError(w, http.StatusServiceUnavailable, "no_leader", err.Error()+": retry")
	default:
		httpjson.WriteError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

// apiErr is an error with its HTTP status and code.
type apiErr struct {
	status int
	code   string
	err    error
}

func (e *apiErr) Error() string { return e.err.Error() }
func (e *apiErr) Unwrap() error { return e.err }

func badRequest(format string, args ...any) error {
	return &apiErr{http.StatusBadRequest, "bad_request", fmt.Errorf(format, args...)}
}

func wrongState(format string, args ...any) error {
	return &apiErr{http.StatusConflict, "wrong_state", fmt.Errorf(format, args...)}
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// decodeJSON decodes r's body strictly into v; its error is a bad request.
func decodeJSON(r *http.Request, v any) error {
	if err := httpjson.DecodeRequest(r, maxBody, v); err != nil {
		return badRequest("%v", err)
	}
	return nil
}
