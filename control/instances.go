package control

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"sync"
	"time"

	"tern/control/controlapi"

	"github.com/google/uuid"

	"tern/agent/agentapi"
	"tern/instance/apiv1"
	"tern/internal/httpjson"
	"tern/volume/ids"
)

// validName is an instance or host name.
// It is compiled at its first use, not when a process linking control
// starts.
var validName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`) })

// Volume geometry: 4 KiB blocks in 1 MiB extents.
const (
	volumeBlockSize    = 4096
	volumeExtentBlocks = 256
	volumeExtentBytes  = volumeBlockSize * volumeExtentBlocks
	// defaultVNI is the virtual network every instance is on for now.
	defaultVNI = 100
	// opWait bounds how long an API call waits for a vmm to report.
	opWait = 2 * time.Minute
)

func validateCreate(req *controlapi.CreateInstance) error {
	var errs []error
	if !validName().MatchString(req.Name) {
		errs = append(errs, fmt.Errorf("name %q: want 1 to 63 letters, digits, '.', '_' or '-'", req.Name))
	}
	if req.VCPUs < 1 || req.VCPUs > 64 {
		errs = append(errs, fmt.Errorf("vcpus %d: want 1 to 64", req.VCPUs))
	}
	if req.MemoryMiB < 2 || req.MemoryMiB > 1<<20 {
		errs = append(errs, fmt.Errorf("memory_mib %d: want 2 to 1048576", req.MemoryMiB))
	}
	if req.Guest.Kind == "" {
		req.Guest.Kind = apiv1.GuestELF
	}
	if req.Guest.Kind != apiv1.GuestELF || req.Guest.Path == "" {
		errs = append(errs, errors.New("guest: want kind elf and a built-in guest's name or an ELF file's path"))
	}
	if req.VolumeBytes%volumeExtentBytes != 0 || req.VolumeBytes > 1<<40 {
		errs = append(errs, fmt.Errorf("volume_bytes %d: want a multiple of 1 MiB up to 1 TiB", req.VolumeBytes))
	}
	if len(errs) > 0 {
		return badRequest("%w", errors.Join(errs...))
	}
	return nil
}

// virtualIP derives an instance's address in 10.0.0.0/8 from its id.
func virtualIP(id uuid.UUID) string {
	n := binary.BigEndian.Uint32(id[:4])
	return net.IPv4(10, byte(n>>16), byte(n>>8), byte(n|1)).String()
}

func (s *Server) createInstance(w http.ResponseWriter, r *http.Request) {
	var req controlapi.CreateInstance
	if err := decodeJSON(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	if err := validateCreate(&req); err != nil {
		writeErr(w, err)
		return
	}
	inst, err := s.CreateInstance(r.Context(), req)
	if err != nil {
		writeErr(w, err)
		return
	}
	httpjson.Write(w, http.StatusCreated, s.instanceView(r.Context(), inst))
}

// CreateInstance records the instance, places and creates its volume's
// regions on three hosts, and starts it when asked.
func (s *Server) CreateInstance(ctx context.Context, req controlapi.CreateInstance) (*controlapi.Instance, error) {
	if _, err := s.findInstance(ctx, req.Name); err == nil {
		return nil, &apiErr{http.StatusConflict, "exists", fmt.Errorf("instance %s exists", req.Name)}
	}
	id := uuid.New()
	inst := &controlapi.Instance{ID: id.String(), Name: req.Name, VCPUs: req.VCPUs, MemoryMiB: req.MemoryMiB, Guest: req.Guest,
		Intent: controlapi.IntentStopped, Network: controlapi.V2PKey{IP: virtualIP(id), VNI: defaultVNI}, Created: time.Now().UTC()}
	var regions []*controlapi.Region
	if req.VolumeBytes > 0 {
		loads, err := s.loads(ctx)
		if err != nil {
			return nil, err
		}
		hosts, err := PlaceRegions(loads)
		if err != nil {
			return nil, &apiErr{http.StatusConflict, "no_capacity", err}
		}
		inst.Volume = &controlapi.Volume{BlockSize: volumeBlockSize, ExtentBlocks: volumeExtentBlocks,
			ExtentCount: uint32(req.VolumeBytes / volumeExtentBytes)}
		volUUID := uuid.NewString()
		for i, h := range hosts {
			reg := &controlapi.Region{ID: fmt.Sprintf("%s-r%d", inst.ID[:8], i), InstanceID: inst.ID, HostID: h, UUID: volUUID}
			regions = append(regions, reg)
			inst.Volume.Regions = append(inst.Volume.Regions, reg.ID)
		}
	}
	writes := []Write{Put(kindInstance, inst.ID, inst, 0)}
	for _, reg := range regions {
		writes = append(writes, Put(kindRegion, reg.ID, reg, 0))
	}
	if err := s.store.Commit(ctx, writes...); err != nil {
		return nil, err
	}
	for _, reg := range regions {
		if err := s.ensureRegion(ctx, reg, inst.Volume); err != nil {
			s.deleteInstanceRecords(context.WithoutCancel(ctx), inst)
			return nil, err
		}
	}
	if req.Start {
		if err := s.StartInstance(ctx, inst.ID); err != nil {
			return inst, err
		}
	}
	v, err := Get[controlapi.Instance](ctx, s.store, kindInstance, inst.ID)
	return &v.Value, err
}

// ensureRegion creates reg on its host and records its address.
func (s *Server) ensureRegion(ctx context.Context, reg *controlapi.Region, vol *controlapi.Volume) error {
	a, err := s.agentFor(ctx, reg.HostID)
	if err != nil {
		return err
	}
	got, err := a.EnsureRegion(ctx, reg.ID, agentapi.RegionSpec{UUID: reg.UUID, BlockSize: vol.BlockSize,
		ExtentBlocks: vol.ExtentBlocks, ExtentCount: vol.ExtentCount})
	if err != nil {
		return fmt.Errorf("creating region %s on host %s: %w", reg.ID, reg.HostID, err)
	}
	_, err = Update(ctx, s.store, kindRegion, reg.ID, func(r *controlapi.Region, exists bool) error {
		if !exists {
			return ErrNotFound
		}
		r.Addr = got.Addr
		return nil
	})
	return err
}

// spec is the instance spec its vmm is ensured with.
func (s *Server) spec(ctx context.Context, inst *controlapi.Instance, gen ids.Generation) (apiv1.Spec, error) {
	sp := apiv1.Spec{ID: inst.ID, Name: inst.Name, VCPUs: inst.VCPUs, MemoryMiB: inst.MemoryMiB, Guest: inst.Guest,
		Init: apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
	if inst.Volume != nil {
		var targets []string
		for _, id := range inst.Volume.Regions {
			reg, err := Get[controlapi.Region](ctx, s.store, kindRegion, id)
			if err != nil {
				return sp, err
			}
			if reg.Value.Addr == "" {
				return sp, fmt.Errorf("region %s has no address yet", id)
			}
			targets = append(targets, reg.Value.Addr)
		}
		wait := uint64(10_000)
		sp.Disks = []apiv1.DiskSpec{{Name: "vol", Backend: apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: targets,
			Region: &apiv1.RegionSpec{BlockSize: inst.Volume.BlockSize, ExtentBlocks: inst.Volume.ExtentBlocks, ExtentCount: inst.Volume.ExtentCount},
			Gen:    gen, QuorumWaitMs: &wait}}}
	}
	return sp, nil
}

// StartInstance places a new vmm for the instance and runs it there.
func (s *Server) StartInstance(ctx context.Context, id string) error {
	loads, err := s.loads(ctx)
	if err != nil {
		return err
	}
	cur, err := Get[controlapi.Instance](ctx, s.store, kindInstance, id)
	if err != nil {
		return err
	}
	inst := cur.Value
	if inst.MigrationID != "" {
		return wrongState("instance %s is migrating", inst.Name)
	}
	if inst.ActiveVMM != "" {
		return nil // already started
	}
	host, err := PlaceVMM(loads, inst.VCPUs, inst.MemoryMiB, "", "instance "+inst.Name)
	if err != nil {
		return err
	}
	vmmID := "vmm-" + uuid.NewString()[:8]
	inst.ActiveVMM, inst.Intent, inst.Failed = vmmID, controlapi.IntentRunning, false
	gen := ids.Generation(1)
	if inst.Volume != nil {
		inst.Volume.Gen++
		gen = inst.Volume.Gen
	}
	vmm := &controlapi.VMM{ID: vmmID, InstanceID: inst.ID, HostID: host, VCPUs: inst.VCPUs, MemoryMiB: inst.MemoryMiB, Created: time.Now().UTC()}
	hrec, err := Get[controlapi.Host](ctx, s.store, kindHost, host)
	if err != nil {
		return err
	}
	v2p := &controlapi.V2P{V2PKey: inst.Network, InstanceID: inst.ID, HostID: host, HostAddress: hrec.Value.Address}
	if err := s.store.Commit(ctx, Put(kindInstance, inst.ID, &inst, cur.Rev), Put(kindVMM, vmmID, vmm, 0),
		Write{Kind: kindV2P, ID: inst.ID, Value: v2p, Unconditional: true}); err != nil {
		return err
	}
	sp, err := s.spec(ctx, &inst, gen)
	if err == nil {
		var body []byte
		body, err = json.Marshal(sp)
		if err == nil {
			a := agentapi.NewClient(hrec.Value.Address, s.cfg.AgentHTTP)
			_, err = a.EnsureVMM(ctx, vmmID, agentapi.EnsureVMM{InstanceID: inst.ID, VCPUs: inst.VCPUs, MemoryMiB: inst.MemoryMiB, Spec: body, Run: true})
		}
	}
	if err != nil {
		// Undo: the vmm holds nothing and the instance has none.
		uctx := context.WithoutCancel(ctx)
		Update(uctx, s.store, kindVMM, vmmID, func(v *controlapi.VMM, exists bool) error { v.Unwound = true; return nil })
		Update(uctx, s.store, kindInstance, inst.ID, func(i *controlapi.Instance, exists bool) error {
			if i.ActiveVMM == vmmID {
				i.ActiveVMM = ""
			}
			return nil
		})
		return fmt.Errorf("starting instance %s on host %s: %w", inst.Name, host, err)
	}
	go s.pushV2P(s.ctx)
	return nil
}

// StopInstance stops the instance's vmm and waits until it is gone.
func (s *Server) StopInstance(ctx context.Context, id string) error {
	inst, err := Update(ctx, s.store, kindInstance, id, func(i *controlapi.Instance, exists bool) error {
		if !exists {
			return ErrNotFound
		}
		if i.MigrationID != "" {
			return wrongState("instance %s is migrating", i.Name)
		}
		i.Intent = controlapi.IntentStopped
		return nil
	})
	if err != nil || inst.ActiveVMM == "" {
		return err
	}
	v, err := Get[controlapi.VMM](ctx, s.store, kindVMM, inst.ActiveVMM)
	if err != nil {
		return err
	}
	a, err := s.agentFor(ctx, v.Value.HostID)
	if err != nil {
		return err
	}
	if err := a.DeleteVMM(ctx, inst.ActiveVMM); err != nil {
		return fmt.Errorf("stopping vmm %s: %w", inst.ActiveVMM, err)
	}
	// The agent reports the vmm gone; the report clears the instance's vmm.
	wctx, cancel := context.WithTimeout(ctx, opWait)
	defer cancel()
	for {
		cur, err := Get[controlapi.Instance](wctx, s.store, kindInstance, id)
		if err != nil {
			return err
		}
		if cur.Value.ActiveVMM == "" {
			return nil
		}
		select {
		case <-s.store.Watch(wctx, kindInstance, id, cur.Rev):
		case <-wctx.Done():
			return fmt.Errorf("waiting for instance %s to stop: %w", inst.Name, wctx.Err())
		}
	}
}

func (s *Server) startInstanceHandler(w http.ResponseWriter, r *http.Request) {
	v, err := s.findInstance(r.Context(), r.PathValue("name"))
	if err == nil {
		err = s.StartInstance(r.Context(), v.Value.ID)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	v, _ = s.findInstance(r.Context(), v.Value.ID)
	httpjson.Write(w, http.StatusOK, s.instanceView(r.Context(), &v.Value))
}

func (s *Server) stopInstanceHandler(w http.ResponseWriter, r *http.Request) {
	v, err := s.findInstance(r.Context(), r.PathValue("name"))
	if err == nil {
		err = s.StopInstance(r.Context(), v.Value.ID)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	v, _ = s.findInstance(r.Context(), v.Value.ID)
	httpjson.Write(w, http.StatusOK, s.instanceView(r.Context(), &v.Value))
}

func (s *Server) deleteInstance(w http.ResponseWriter, r *http.Request) {
	v, err := s.findInstance(r.Context(), r.PathValue("name"))
	if err == nil {
		err = s.StopInstance(r.Context(), v.Value.ID)
	}
	if err != nil {
		writeErr(w, err)
		return
	}
	if err := s.deleteInstanceRecords(r.Context(), &v.Value); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// deleteInstanceRecords deletes the instance's regions on their hosts,
// then its records.
func (s *Server) deleteInstanceRecords(ctx context.Context, inst *controlapi.Instance) error {
	if inst.Volume != nil {
		for _, id := range inst.Volume.Regions {
			reg, err := Get[controlapi.Region](ctx, s.store, kindRegion, id)
			if err != nil {
				continue
			}
			if a, err := s.agentFor(ctx, reg.Value.HostID); err == nil {
				if err := a.DeleteRegion(ctx, id); err != nil {
					return fmt.Errorf("deleting region %s: %w", id, err)
				}
			}
			s.store.Commit(ctx, Write{Kind: kindRegion, ID: id, Unconditional: true})
		}
	}
	err := s.store.Commit(ctx, Write{Kind: kindInstance, ID: inst.ID, Unconditional: true},
		Write{Kind: kindV2P, ID: inst.ID, Unconditional: true})
	go s.pushV2P(s.ctx)
	return err
}

// pushV2P sends every host the whole mapping table.
func (s *Server) pushV2P(ctx context.Context) {
	all, err := List[controlapi.V2P](ctx, s.store, kindV2P)
	if err != nil {
		return
	}
	hosts, err := List[controlapi.Host](ctx, s.store, kindHost)
	if err != nil {
		return
	}
	underlay := map[string]string{}
	for _, h := range hosts {
		underlay[h.Value.ID] = h.Value.Underlay
	}
	m := []agentapi.Mapping{}
	for _, v := range all {
		m = append(m, agentapi.Mapping{IP: v.Value.IP, VNI: v.Value.VNI, InstanceID: v.Value.InstanceID, HostID: v.Value.HostID,
			HostAddress: v.Value.HostAddress, HostUnderlay: underlay[v.Value.HostID]})
	}
	for _, h := range hosts {
		if err := agentapi.NewClient(h.Value.Address, s.cfg.AgentHTTP).PutV2P(ctx, m); err != nil {
			s.log.Warn("pushing v2p mappings", "host", h.Value.ID, "err", err)
		}
	}
}
