package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"time"

	"tern/control/controlapi"

	"tern/agent/agentapi"
	"tern/internal/httpjson"
)

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /v1/hosts", s.listHosts)
	m.HandleFunc("GET /v1/hosts/{id}", s.getHost)
	m.HandleFunc("PUT /v1/hosts/{id}", s.registerHost)
	m.HandleFunc("POST /v1/hosts/{id}/drain", s.postDrain)
	m.HandleFunc("GET /v1/hosts/{id}/drain", s.getDrain)
	m.HandleFunc("POST /v1/instances", s.createInstance)
	m.HandleFunc("GET /v1/instances", s.listInstances)
	m.HandleFunc("GET /v1/instances/{name}", s.getInstance)
	m.HandleFunc("DELETE /v1/instances/{name}", s.deleteInstance)
	m.HandleFunc("POST /v1/instances/{name}/start", s.startInstanceHandler)
	m.HandleFunc("POST /v1/instances/{name}/stop", s.stopInstanceHandler)
	m.HandleFunc("POST /v1/instances/{name}/migrate", s.migrateInstance)
	m.HandleFunc("GET /v1/migrations", s.listMigrations)
	m.HandleFunc("GET /v1/migrations/{id}", s.getMigration)
	m.HandleFunc("POST /v1/reports", s.postReport)
	m.HandleFunc("GET /v1/v2p", s.listV2P)
	m.HandleFunc("GET /v1/leader", s.getLeader)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		httpjson.WriteError(w, http.StatusNotFound, "not_found", "no route "+r.Method+" "+r.URL.Path)
	})
	s.mux = m
}

func (s *Server) hostView(ctx context.Context, h controlapi.Host, vmms []Versioned[controlapi.VMM]) controlapi.HostView {
	v := controlapi.HostView{ID: h.ID, Address: h.Address, State: h.State, CPUs: h.CPUs, MemoryMiB: h.MemoryMiB, Build: h.Build, VMMIDs: []string{}}
	for _, m := range vmms {
		if m.Value.HostID == h.ID && m.Value.ProcessLive() {
			v.VMMs++
			v.VMMIDs = append(v.VMMIDs, m.Value.ID)
		}
	}
	return v
}

func (s *Server) listHosts(w http.ResponseWriter, r *http.Request) {
	hosts, err := List[controlapi.Host](r.Context(), s.store, kindHost)
	if err != nil {
		writeErr(w, err)
		return
	}
	vmms, err := List[controlapi.VMM](r.Context(), s.store, kindVMM)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []controlapi.HostView{}
	for _, h := range hosts {
		out = append(out, s.hostView(r.Context(), h.Value, vmms))
	}
	httpjson.Write(w, http.StatusOK, out)
}

func (s *Server) getHost(w http.ResponseWriter, r *http.Request) {
	h, err := Get[controlapi.Host](r.Context(), s.store, kindHost, r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	vmms, err := List[controlapi.VMM](r.Context(), s.store, kindVMM)
	if err != nil {
		writeErr(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, s.hostView(r.Context(), h.Value, vmms))
}

// registerHost records an agent's host (its state is kept across
// re-registrations), then pushes it the network mappings.
func (s *Server) registerHost(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var reg agentapi.Registration
	if err := decodeJSON(r, &reg); err != nil {
		writeErr(w, err)
		return
	}
	if reg.Address == "" || reg.CPUs < 1 || reg.MemoryMiB == 0 || !validName().MatchString(id) {
		writeErr(w, badRequest("a host needs an id, address, cpus and memory_mib"))
		return
	}
	h, err := Update(r.Context(), s.store, kindHost, id, func(h *controlapi.Host, exists bool) error {
		if !exists {
			h.State = controlapi.HostActive
		}
		h.ID, h.Address, h.CPUs, h.MemoryMiB = id, reg.Address, reg.CPUs, reg.MemoryMiB
		h.Build, h.MigrationProtocols, h.RegisteredAt = reg.Build, reg.MigrationProtocols, time.Now().UTC()
		h.Underlay = reg.Underlay
		return nil
	})
	if err != nil {
		writeErr(w, err)
		return
	}
	s.log.Info("host registered", "host", id, "address", reg.Address)
	if err := s.goneUnlessRunning(r.Context(), id, reg.VMMs); err != nil {
		writeErr(w, err)
		return
	}
	go s.pushV2P(s.ctx)
	httpjson.Write(w, http.StatusOK, h)
}

// findInstance finds an instance by name or id.
func (s *Server) findInstance(ctx context.Context, key string) (Versioned[controlapi.Instance], error) {
	if v, err := Get[controlapi.Instance](ctx, s.store, kindInstance, key); err == nil {
		return v, nil
	}
	all, err := List[controlapi.Instance](ctx, s.store, kindInstance)
	if err != nil {
		return Versioned[controlapi.Instance]{}, err
	}
	for _, v := range all {
		if v.Value.Name == key {
			return v, nil
		}
	}
	return Versioned[controlapi.Instance]{}, fmt.Errorf("instance %s: %w", key, ErrNotFound)
}

func (s *Server) listInstances(w http.ResponseWriter, r *http.Request) {
	all, err := List[controlapi.Instance](r.Context(), s.store, kindInstance)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []controlapi.InstanceView{}
	for _, v := range all {
		out = append(out, s.instanceView(r.Context(), &v.Value))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	httpjson.Write(w, http.StatusOK, out)
}

func (s *Server) getInstance(w http.ResponseWriter, r *http.Request) {
	v, err := s.findInstance(r.Context(), r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, s.instanceView(r.Context(), &v.Value))
}

func (s *Server) listMigrations(w http.ResponseWriter, r *http.Request) {
	all, err := List[controlapi.Migration](r.Context(), s.store, kindMigration)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []controlapi.Migration{}
	for _, v := range all {
		out = append(out, v.Value)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Started.Before(out[j].Started) })
	httpjson.Write(w, http.StatusOK, out)
}

func (s *Server) getMigration(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	v, err := Get[controlapi.Migration](r.Context(), s.store, kindMigration, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	if after, ok := waitQuery(r); ok && v.Rev <= after {
		ctx, cancel := context.WithTimeout(r.Context(), drainPollWait)
		defer cancel()
		<-s.store.Watch(ctx, kindMigration, id, after)
		if v2, err := Get[controlapi.Migration](r.Context(), s.store, kindMigration, id); err == nil {
			v = v2
		}
	}
	v.Value.Rev = v.Rev
	httpjson.Write(w, http.StatusOK, v.Value)
}

func (s *Server) listV2P(w http.ResponseWriter, r *http.Request) {
	all, err := List[controlapi.V2P](r.Context(), s.store, kindV2P)
	if err != nil {
		writeErr(w, err)
		return
	}
	out := []controlapi.V2P{}
	for _, v := range all {
		out = append(out, v.Value)
	}
	httpjson.Write(w, http.StatusOK, out)
}

func (s *Server) postReport(w http.ResponseWriter, r *http.Request) {
	var rep agentapi.Report
	if err := decodeJSON(r, &rep); err != nil {
		writeErr(w, err)
		return
	}
	if rep.VMMID == "" || rep.HostID == "" || rep.Gen == 0 {
		writeErr(w, badRequest("a report needs host_id, vmm_id and a generation above 0"))
		return
	}
	applied, err := s.ApplyReport(r.Context(), rep)
	if err != nil && !errors.Is(err, ErrNotFound) {
		writeErr(w, err)
		return
	}
	httpjson.Write(w, http.StatusOK, map[string]bool{"applied": applied})
}

// waitQuery reads ?after_rev= for a long-poll.
func waitQuery(r *http.Request) (int64, bool) {
	v := r.URL.Query().Get("after_rev")
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseInt(v, 10, 64)
	return n, err == nil && n >= 0
}

// leaderWait bounds GET /v1/leader?wait=leading.
const leaderWait = 30 * time.Second

// getLeader answers who leads; with ?wait=leading it first waits (up to
// leaderWait) for this process to lead, with ?wait=known for any leader.
func (s *Server) getLeader(w http.ResponseWriter, r *http.Request) {
	wait := r.URL.Query().Get("wait")
	if wait != "" && wait != "leading" && wait != "known" {
		writeErr(w, badRequest("wait %q: want leading or known", wait))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), leaderWait)
	defer cancel()
	for {
		s.mu.Lock()
		v := controlapi.LeaderView{URL: s.cfg.URL, Leading: s.leader, LeaderURL: s.leaderURL}
		changed := s.leaderChanged
		s.mu.Unlock()
		if wait == "" || wait == "leading" && v.Leading || wait == "known" && v.LeaderURL != "" {
			httpjson.Write(w, http.StatusOK, v)
			return
		}
		select {
		case <-changed:
		case <-ctx.Done():
			httpjson.Write(w, http.StatusOK, v)
			return
		}
	}
}

// goneUnlessRunning records as gone every vmm of host that reported
// (its agent had it) and that the agent, registering, no longer runs:
// the agent restarted and its children died with it. A vmm that never
// reported is left to its saga.
func (s *Server) goneUnlessRunning(ctx context.Context, host string, running []string) error {
	vmms, err := List[controlapi.VMM](ctx, s.store, kindVMM)
	if err != nil {
		return err
	}
	live := map[string]bool{}
	for _, id := range running {
		live[id] = true
	}
	for _, v := range vmms {
		vm := v.Value
		if vm.HostID != host || !vm.ProcessLive() || vm.Gen == 0 || live[vm.ID] {
			continue
		}
		s.log.Warn("vmm gone with its agent", "vmm", vm.ID, "host", host)
		if _, err := s.ApplyReport(ctx, agentapi.Report{HostID: host, VMMID: vm.ID, InstanceID: vm.InstanceID,
			Gen: vm.Gen + 1, State: vm.State, Gone: true}); err != nil {
			return err
		}
	}
	return nil
}
