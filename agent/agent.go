package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"sync"
	"time"

	"github.com/VictoriaMetrics/metrics"

	"tern/agent/agentapi"
	"tern/dataplane"
	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/child"
	"tern/internal/httpjson"
	"tern/internal/telemetry"
)

// Config is an agent's configuration.
type Config struct {
	// HostID names the host; Address is the agent's API URL.
	HostID, Address string
	// IP is the address its vmms and downstairs listen on.
	IP string
	// DataDir holds regions and logs; Certs the certificates passed to
	// vmms and downstairs.
	DataDir, Certs string
	// Tern is the tern binary that children run.
	Tern string
	// CPUs and MemoryMiB are the capacity offered.
	CPUs      int
	MemoryMiB uint64
	// Version is what GET /v1/version answers (the vmms', same binary).
	Version apiv1.Version
	// Control is the control plane's URL ("": report to no one);
	// ControlHTTP the client to reach it.
	Control     string
	ControlHTTP *http.Client
	Logger      *slog.Logger
	// Plane is the host's network data plane (nil: none; PUT /v1/v2p
	// then only records the table); Underlay is this host's address on
	// it, registered with the control plane.
	Plane    *dataplane.Plane
	Underlay netip.Addr
}

// Agent serves one host's API.
type Agent struct {
	cfg Config
	log *slog.Logger
	mux *http.ServeMux
	// metrics is what GET /metrics serves: the data plane's counters.
	metrics *metrics.Set
	ctx     context.Context
	// stop ends ctx: relays, the sender, registration.
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu sync.Mutex
	// vmms and regions are the live ones, by id (guarded by mu).
	vmms    map[string]*vmmProc
	regions map[string]*regionProc
	v2p     []agentapi.Mapping
	// pending holds each vmm's newest unsent report (guarded by mu);
	// wake has one slot to tell the sender.
	pending map[string]agentapi.Report
	wake    chan struct{}
	// v2pMu serialises PUT /v1/v2p (held across the data plane's Apply,
	// which mu is not).
	v2pMu sync.Mutex
	// invGen counts the inventory's changes (advanced under mu) and
	// wakes its long-polls.
	invGen *httpjson.Generation
	// registered is set once the control plane took the registration
	// (guarded by mu).
	registered bool
}

type vmmProc struct {
	status agentapi.VMMStatus
	proc   *child.Process
	client *client.Client
	// ensured is set once the spec was accepted.
	ensured bool
	// stopping is set once the agent itself stops the process.
	stopping bool
}

// New starts an agent: it restarts the downstairs of every region in
// DataDir and, with a control URL, registers and starts relaying.
func New(cfg Config) (*Agent, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if cfg.ControlHTTP == nil {
		cfg.ControlHTTP = http.DefaultClient
	}
	ctx, stop := context.WithCancel(context.Background())
	a := &Agent{cfg: cfg, log: cfg.Logger.With("component", "agent", "host", cfg.HostID), ctx: ctx, stop: stop,
		vmms: map[string]*vmmProc{}, regions: map[string]*regionProc{}, pending: map[string]agentapi.Report{}, wake: make(chan struct{}, 1),
		invGen: httpjson.NewGeneration(1)}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "regions"), 0o755); err != nil {
		return nil, fmt.Errorf("creating data dir: %w", err)
	}
	if err := a.restartRegions(); err != nil {
		a.Close()
		return nil, err
	}
	a.metrics = metrics.NewSet()
	if cfg.Plane != nil {
		cfg.Plane.RegisterMetrics(a.metrics)
	}
	a.routes()
	if cfg.Control != "" {
		a.wg.Add(2)
		go a.register()
		go a.sendReports()
	}
	return a, nil
}

// ServeHTTP serves the agent API.
func (a *Agent) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Close stops every vmm and downstairs the agent started and its
// goroutines.
func (a *Agent) Close() {
	a.stop()
	a.mu.Lock()
	var procs []*child.Process
	for _, v := range a.vmms {
		v.stopping = true
		procs = append(procs, v.proc)
	}
	for _, r := range a.regions {
		procs = append(procs, r.proc)
	}
	a.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(func() { p.Stop(time.Minute) })
	}
	wg.Wait()
	a.wg.Wait()
}

// validID is what vmm and region ids may be: they name directories.
// It is compiled at its first use, not when a process linking the agent
// starts.
var validID = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

func (a *Agent) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) { httpjson.Write(w, http.StatusOK, a.cfg.Version) })
	m.HandleFunc("GET /v1/inventory", a.getInventory)
	m.HandleFunc("PUT /v1/vmms/{id}", a.putVMM)
	m.HandleFunc("GET /v1/vmms/{id}", a.getVMM)
	m.HandleFunc("DELETE /v1/vmms/{id}", a.deleteVMM)
	m.HandleFunc("PUT /v1/vmms/{id}/state", a.putVMMState)
	m.HandleFunc("GET /v1/vmms/{id}/version", a.getVMMVersion)
	m.HandleFunc("PUT /v1/regions/{id}", a.putRegion)
	m.HandleFunc("DELETE /v1/regions/{id}", a.deleteRegion)
	m.HandleFunc("PUT /v1/v2p", a.putV2P)
	m.HandleFunc("GET /v1/v2p", func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		defer a.mu.Unlock()
		httpjson.Write(w, http.StatusOK, append([]agentapi.Mapping{}, a.v2p...))
	})
	m.Handle("GET /metrics", telemetry.MetricsHandler(a.metrics))
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpjson.WriteError(w, http.StatusNotFound, "not_found", "no route "+r.Method+" "+r.URL.Path)
	})
	a.mux = m
}

// changedLocked counts one change of the inventory and wakes its
// long-polls.
func (a *Agent) changedLocked() {
	a.invGen.Advance()
}

// inventoryWait bounds GET /v1/inventory?after_gen=N.
const inventoryWait = 30 * time.Second

// getInventory answers the inventory; with ?after_gen=N it first waits
// (up to inventoryWait) for one newer than generation N.
func (a *Agent) getInventory(w http.ResponseWriter, r *http.Request) {
	after, ok := httpjson.AfterGen(r)
	if !ok {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("after_gen %q: want a generation", r.URL.Query().Get("after_gen")))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), inventoryWait)
	defer cancel()
	a.invGen.WaitAfter(ctx, after)
	httpjson.Write(w, http.StatusOK, a.Inventory())
}

// Inventory returns the host's capacity, allocations and processes.
func (a *Agent) Inventory() agentapi.Inventory {
	a.mu.Lock()
	defer a.mu.Unlock()
	inv := agentapi.Inventory{HostID: a.cfg.HostID, Address: a.cfg.Address, Gen: agentapi.InventoryGen(a.invGen.Load()), Registered: a.registered, CPUs: a.cfg.CPUs, MemoryMiB: a.cfg.MemoryMiB,
		Version: a.cfg.Version, VMMs: []agentapi.VMMStatus{}, Regions: []agentapi.Region{}}
	for _, v := range a.vmms {
		inv.VMMs = append(inv.VMMs, v.status)
		inv.AllocatedCPUs += v.status.VCPUs
		inv.AllocatedMemoryMiB += v.status.MemoryMiB
	}
	for _, r := range a.regions {
		inv.Regions = append(inv.Regions, r.region)
	}
	sort.Slice(inv.VMMs, func(i, j int) bool { return inv.VMMs[i].ID < inv.VMMs[j].ID })
	sort.Slice(inv.Regions, func(i, j int) bool { return inv.Regions[i].ID < inv.Regions[j].ID })
	return inv
}

func (a *Agent) putVMM(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req agentapi.EnsureVMM
	if !validID().MatchString(id) {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("vmm id %q: want letters, digits, '.', '_' or '-'", id))
		return
	}
	if err := httpjson.DecodeRequest(r, maxBody, &req); err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	var problems []error
	if req.InstanceID == "" {
		problems = append(problems, errors.New("instance_id is required"))
	}
	if req.VCPUs < 1 || req.MemoryMiB == 0 {
		problems = append(problems, errors.New("vcpus and memory_mib must be positive"))
	}
	if len(req.Spec) == 0 {
		problems = append(problems, errors.New("spec is required"))
	}
	if len(problems) > 0 {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", errors.Join(problems...).Error())
		return
	}
	st, err := a.ensureVMM(r.Context(), id, req)
	if err != nil {
		var he *httpError
		if errors.As(err, &he) {
			httpjson.WriteError(w, he.status, he.code, he.msg)
			return
		}
		httpjson.WriteError(w, http.StatusBadGateway, "vmm_error", err.Error())
		return
	}
	httpjson.Write(w, http.StatusOK, st)
}

type httpError struct {
	status    int
	code, msg string
}

func (e *httpError) Error() string { return e.msg }

// ensureVMM starts the vmm (once) and ensures its spec.
func (a *Agent) ensureVMM(ctx context.Context, id string, req agentapi.EnsureVMM) (agentapi.VMMStatus, error) {
	a.mu.Lock()
	v, ok := a.vmms[id]
	if !ok {
		cpus, mem := 0, uint64(0)
		for _, o := range a.vmms {
			cpus += o.status.VCPUs
			mem += o.status.MemoryMiB
		}
		if cpus+req.VCPUs > a.cfg.CPUs || mem+req.MemoryMiB > a.cfg.MemoryMiB {
			a.mu.Unlock()
			return agentapi.VMMStatus{}, &httpError{http.StatusConflict, "no_capacity",
				fmt.Sprintf("host %s has %d of %d CPUs and %d of %d MiB free; vmm %s asks %d and %d MiB",
					a.cfg.HostID, a.cfg.CPUs-cpus, a.cfg.CPUs, a.cfg.MemoryMiB-mem, a.cfg.MemoryMiB, id, req.VCPUs, req.MemoryMiB)}
		}
		logf, err := os.OpenFile(filepath.Join(a.cfg.DataDir, "vmm-"+id+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			a.mu.Unlock()
			return agentapi.VMMStatus{}, fmt.Errorf("opening vmm log: %w", err)
		}
		proc, url, err := startVMMProcess(a.cfg.Tern, a.cfg.IP, a.cfg.Certs, logf)
		logf.Close()
		if err != nil {
			a.mu.Unlock()
			return agentapi.VMMStatus{}, err
		}
		c, _ := client.New(url, nil)
		v = &vmmProc{proc: proc, client: c, status: agentapi.VMMStatus{ID: id, InstanceID: req.InstanceID, URL: url,
			State: apiv1.Creating, VCPUs: req.VCPUs, MemoryMiB: req.MemoryMiB}}
		a.vmms[id] = v
		a.changedLocked()
		a.log.Info("vmm started", "vmm", id, "instance", req.InstanceID, "url", url)
	}
	a.mu.Unlock()
	if v.status.InstanceID != req.InstanceID {
		return agentapi.VMMStatus{}, &httpError{http.StatusConflict, "wrong_instance", fmt.Sprintf("vmm %s runs instance %s", id, v.status.InstanceID)}
	}
	view, err := v.client.EnsureRaw(ctx, req.Spec)
	if err != nil {
		a.mu.Lock()
		if !v.ensured && a.vmms[id] == v {
			// A fresh process that took no spec runs nothing: stop it.
			delete(a.vmms, id)
			a.changedLocked()
			a.mu.Unlock()
			v.proc.Stop(time.Minute)
		} else {
			a.mu.Unlock()
		}
		var ae *client.APIError
		if errors.As(err, &ae) && ae.Status/100 == 4 {
			return agentapi.VMMStatus{}, &httpError{ae.Status, ae.Body.ErrorCode, ae.Body.Message}
		}
		return agentapi.VMMStatus{}, fmt.Errorf("ensuring vmm %s: %w", id, err)
	}
	a.mu.Lock()
	if !v.ensured {
		v.ensured = true
		a.wg.Add(1)
		go a.supervise(id, v)
	}
	a.mu.Unlock()
	if req.Run {
		if err := v.client.RequestState(ctx, apiv1.Run); err != nil && !client.IsCode(err, apiv1.CodeWrongState) {
			return agentapi.VMMStatus{}, fmt.Errorf("running vmm %s: %w", id, err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if v.status.MigrationAddr != view.MigrationAddr {
		v.status.MigrationAddr = view.MigrationAddr
		a.changedLocked()
	}
	return v.status, nil
}

// supervise relays v's snapshots until its instance is destroyed (then
// stops the process) or the process dies (reported gone, not restarted).
func (a *Agent) supervise(id string, v *vmmProc) {
	defer a.wg.Done()
	ctx, cancel := context.WithCancel(a.ctx)
	defer cancel()
	go func() {
		select {
		case <-v.proc.Exited():
			cancel()
		case <-ctx.Done():
		}
	}()
	var gen apiv1.ViewGen
	for {
		s, err := v.client.Monitor(ctx, gen)
		if err != nil {
			break
		}
		if s.Gen <= gen {
			continue
		}
		gen = s.Gen
		a.mu.Lock()
		v.status.State, v.status.Gen = s.State, s.Gen
		a.changedLocked()
		a.queueLocked(agentapi.Report{HostID: a.cfg.HostID, VMMID: id, InstanceID: v.status.InstanceID, Gen: s.Gen, State: s.State,
			In: activeProgress(s.Migration.In), Out: activeProgress(s.Migration.Out)})
		a.mu.Unlock()
		if s.State == apiv1.Destroyed {
			break
		}
	}
	select {
	case <-v.proc.Exited():
	default:
		if a.ctx.Err() == nil {
			v.proc.Stop(time.Minute)
		}
	}
	<-v.proc.Exited()
	a.mu.Lock()
	defer a.mu.Unlock()
	if !v.stopping && v.status.State != apiv1.Destroyed {
		a.log.Error("vmm died", "vmm", id, "state", v.status.State, "err", v.proc.Err())
	}
	v.status.Gone = true
	v.status.Gen++
	a.queueLocked(agentapi.Report{HostID: a.cfg.HostID, VMMID: id, InstanceID: v.status.InstanceID, Gen: v.status.Gen,
		State: v.status.State, Gone: true})
	delete(a.vmms, id)
	a.changedLocked()
}

func (a *Agent) getVMM(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	v, ok := a.vmms[r.PathValue("id")]
	var st agentapi.VMMStatus
	if ok {
		st = v.status
	}
	a.mu.Unlock()
	if !ok {
		httpjson.WriteError(w, http.StatusNotFound, agentapi.CodeNoSuchVMM, "no vmm "+r.PathValue("id")+" on this host")
		return
	}
	httpjson.Write(w, http.StatusOK, st)
}

func (a *Agent) deleteVMM(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	v, ok := a.vmms[r.PathValue("id")]
	if ok {
		v.stopping = true
	}
	a.mu.Unlock()
	if ok {
		v.proc.Stop(time.Minute)
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) putVMMState(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	v, ok := a.vmms[r.PathValue("id")]
	a.mu.Unlock()
	if !ok {
		httpjson.WriteError(w, http.StatusNotFound, agentapi.CodeNoSuchVMM, "no vmm "+r.PathValue("id")+" on this host")
		return
	}
	var req apiv1.StateRequest
	if err := httpjson.DecodeRequest(r, maxBody, &req); err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	if err := v.client.RequestState(r.Context(), req.Requested); err != nil {
		var ae *client.APIError
		if errors.As(err, &ae) {
			httpjson.WriteError(w, ae.Status, ae.Body.ErrorCode, ae.Body.Message)
			return
		}
		httpjson.WriteError(w, http.StatusBadGateway, "vmm_error", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (a *Agent) getVMMVersion(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	v, ok := a.vmms[r.PathValue("id")]
	a.mu.Unlock()
	if !ok {
		httpjson.WriteError(w, http.StatusNotFound, agentapi.CodeNoSuchVMM, "no vmm "+r.PathValue("id")+" on this host")
		return
	}
	ver, err := v.client.Version(r.Context())
	if err != nil {
		httpjson.WriteError(w, http.StatusBadGateway, "vmm_error", err.Error())
		return
	}
	httpjson.Write(w, http.StatusOK, ver)
}

func (a *Agent) putV2P(w http.ResponseWriter, r *http.Request) {
	var m []agentapi.Mapping
	if err := httpjson.DecodeRequest(r, maxBody, &m); err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	for _, e := range m {
		if net.ParseIP(e.IP) == nil || e.InstanceID == "" || e.HostID == "" {
			httpjson.WriteError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("mapping %+v: want an ip, instance_id and host_id", e))
			return
		}
	}
	// One table at a time, so the plane and a.v2p agree on the last.
	a.v2pMu.Lock()
	defer a.v2pMu.Unlock()
	if a.cfg.Plane != nil {
		table, err := planeTable(m, a.cfg.HostID, a.cfg.Underlay)
		if err != nil {
			a.log.Warn("v2p mappings the data plane cannot place", "err", err)
		}
		if err := a.cfg.Plane.Apply(table); err != nil {
			a.log.Error("applying v2p mappings", "err", err)
			if errors.Is(err, dataplane.ErrBadTable) {
				httpjson.WriteError(w, http.StatusBadRequest, "bad_request", err.Error())
				return
			}
			httpjson.WriteError(w, http.StatusInternalServerError, "dataplane_error", err.Error())
			return
		}
	}
	a.mu.Lock()
	a.v2p = m
	a.mu.Unlock()
	a.log.Info("v2p mappings", "count", len(m), "dataplane", a.cfg.Plane != nil)
	w.WriteHeader(http.StatusNoContent)
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// activeProgress is p, or nil when it describes no migration.
func activeProgress(p apiv1.Progress) *apiv1.Progress {
	if !p.Active() {
		return nil
	}
	return &p
}
