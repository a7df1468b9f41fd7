package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/google/uuid"

	"tern/agent/agentapi"
	"tern/internal/child"
	"tern/internal/httpjson"
	"tern/volume/downstairs"
	"tern/volume/extent"
)

// regionProc is a region and its downstairs process.
type regionProc struct {
	region agentapi.Region
	proc   *child.Process
}

// regionListenFile keeps, in a region's directory, the address its
// downstairs serves: a restarted agent serves it at the same one, so the
// volume's targets stay valid.
const regionListenFile = "agent-listen"

func (a *Agent) regionDir(id string) string { return filepath.Join(a.cfg.DataDir, "regions", id) }

// restartRegions runs the downstairs of every region in the data dir.
func (a *Agent) restartRegions() error {
	entries, err := os.ReadDir(filepath.Join(a.cfg.DataDir, "regions"))
	if err != nil {
		return fmt.Errorf("reading regions: %w", err)
	}
	for _, e := range entries {
		if !e.IsDir() || !validID().MatchString(e.Name()) {
			continue
		}
		if _, err := a.runRegion(e.Name()); err != nil {
			return err
		}
	}
	return nil
}

// runRegion starts id's downstairs unless it runs, and returns it.
func (a *Agent) runRegion(id string) (agentapi.Region, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if r, ok := a.regions[id]; ok {
		select {
		case <-r.proc.Exited():
		default:
			return r.region, nil
		}
	}
	dir := a.regionDir(id)
	spec, err := readRegionSpec(dir)
	if err != nil {
		return agentapi.Region{}, fmt.Errorf("reading region %s: %w", id, err)
	}
	listen := net.JoinHostPort(a.cfg.IP, "0")
	if b, err := os.ReadFile(filepath.Join(dir, regionListenFile)); err == nil {
		listen = string(b)
	}
	logf, err := os.OpenFile(filepath.Join(a.cfg.DataDir, "downstairs-"+id+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return agentapi.Region{}, fmt.Errorf("opening downstairs log: %w", err)
	}
	proc, addr, err := startDownstairsProcess(a.cfg.Tern, dir, listen, a.cfg.Certs, logf)
	if err != nil {
		logf.Close()
		return agentapi.Region{}, err
	}
	go func() { <-proc.Exited(); logf.Close() }()
	if err := os.WriteFile(filepath.Join(dir, regionListenFile), []byte(addr), 0o644); err != nil {
		proc.Stop(0)
		return agentapi.Region{}, fmt.Errorf("recording region %s's address: %w", id, err)
	}
	r := agentapi.Region{ID: id, UUID: spec.UUID.String(), Addr: addr}
	a.regions[id] = &regionProc{region: r, proc: proc}
	a.changedLocked()
	a.log.Info("downstairs started", "region", id, "addr", addr)
	return r, nil
}

func (a *Agent) putRegion(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var req agentapi.RegionSpec
	if !validID().MatchString(id) {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("region id %q: want letters, digits, '.', '_' or '-'", id))
		return
	}
	if err := httpjson.DecodeRequest(r, maxBody, &req); err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	u, err := uuid.Parse(req.UUID)
	if err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("uuid %q: %v", req.UUID, err))
		return
	}
	spec := extent.NewSpec(req.BlockSize, req.ExtentBlocks, req.ExtentCount)
	spec.UUID = u
	if err := spec.Validate(); err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	dir := a.regionDir(id)
	if existing, err := readRegionSpec(dir); err == nil {
		if existing.UUID != u {
			httpjson.WriteError(w, http.StatusConflict, "region_exists", fmt.Sprintf("region %s exists with uuid %s", id, existing.UUID))
			return
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		httpjson.WriteError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	} else if err := downstairs.Create(dir, spec); err != nil {
		httpjson.WriteError(w, http.StatusInternalServerError, "internal", fmt.Sprintf("creating region %s: %v", id, err))
		return
	}
	reg, err := a.runRegion(id)
	if err != nil {
		httpjson.WriteError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	httpjson.Write(w, http.StatusOK, reg)
}

func (a *Agent) deleteRegion(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !validID().MatchString(id) {
		httpjson.WriteError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("region id %q: want letters, digits, '.', '_' or '-'", id))
		return
	}
	a.mu.Lock()
	rp, ok := a.regions[id]
	delete(a.regions, id)
	a.changedLocked()
	a.mu.Unlock()
	if ok {
		rp.proc.Stop(childWait)
	}
	if err := os.RemoveAll(a.regionDir(id)); err != nil {
		httpjson.WriteError(w, http.StatusInternalServerError, "internal", err.Error())
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// readRegionSpec reads a region directory's region.json (os.ErrNotExist
// when it has none).
func readRegionSpec(dir string) (extent.Spec, error) {
	var spec extent.Spec
	b, err := os.ReadFile(filepath.Join(dir, "region.json"))
	if err != nil {
		return spec, err
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return spec, fmt.Errorf("decoding %s/region.json: %w", dir, err)
	}
	return spec, nil
}
