package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"tern/control/controlapi"

	"tern/internal/httpjson"
)

// Drain states.
const (
	drainRunning = "running"
	drainDone    = "done"
	drainFailed  = "failed"
)

// drainPollWait is how long GET /v1/hosts/{id}/drain?after_rev= waits.
const drainPollWait = 30 * time.Second

func (s *Server) postDrain(w http.ResponseWriter, r *http.Request) {
	d, err := s.StartDrain(r.Context(), r.PathValue("id"))
	if err != nil {
		writeErr(w, err)
		return
	}
	httpjson.Write(w, http.StatusAccepted, d)
}

func (s *Server) getDrain(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	d, err := Get[controlapi.Drain](r.Context(), s.store, kindDrain, id)
	if err != nil {
		writeErr(w, err)
		return
	}
	if after, ok := waitQuery(r); ok && d.Rev <= after {
		ctx, cancel := context.WithTimeout(r.Context(), drainPollWait)
		defer cancel()
		<-s.store.Watch(ctx, kindDrain, id, after)
		if d2, err := Get[controlapi.Drain](r.Context(), s.store, kindDrain, id); err == nil {
			d = d2
		}
	}
	d.Value.Rev = d.Rev
	httpjson.Write(w, http.StatusOK, d.Value)
}

// StartDrain plans moving every instance off host (first-fit decreasing
// by memory; refused naming an instance that fits nowhere), marks the
// host draining and runs the drain in the background.
func (s *Server) StartDrain(ctx context.Context, host string) (controlapi.Drain, error) {
	h, err := Get[controlapi.Host](ctx, s.store, kindHost, host)
	if err != nil {
		return controlapi.Drain{}, err
	}
	if old, err := Get[controlapi.Drain](ctx, s.store, kindDrain, host); err == nil && old.Value.State == drainRunning {
		return old.Value, nil
	}
	insts, err := List[controlapi.Instance](ctx, s.store, kindInstance)
	if err != nil {
		return controlapi.Drain{}, err
	}
	var items []controlapi.DrainItem
	for _, in := range insts {
		if in.Value.ActiveVMM == "" {
			continue
		}
		v, err := Get[controlapi.VMM](ctx, s.store, kindVMM, in.Value.ActiveVMM)
		if err != nil || v.Value.HostID != host || !v.Value.HoldsResources() {
			continue
		}
		items = append(items, controlapi.DrainItem{InstanceID: in.Value.ID, Name: in.Value.Name, VCPUs: in.Value.VCPUs, MemoryMiB: in.Value.MemoryMiB})
	}
	loads, err := s.loads(ctx)
	if err != nil {
		return controlapi.Drain{}, err
	}
	plan, err := PlanDrain(loads, host, items)
	if err != nil {
		return controlapi.Drain{}, &apiErr{http.StatusConflict, "cannot_drain", err}
	}
	d := controlapi.Drain{HostID: host, State: drainRunning, Plan: plan, Migrations: map[string]string{}, Started: time.Now().UTC()}
	hv := h.Value
	hv.State = controlapi.HostDraining
	old, err := Get[controlapi.Drain](ctx, s.store, kindDrain, host)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return controlapi.Drain{}, err
	}
	if err := s.store.Commit(ctx, Put(kindHost, host, &hv, h.Rev), Put(kindDrain, host, &d, old.Rev)); err != nil {
		return controlapi.Drain{}, err
	}
	s.goDrain(host)
	return d, nil
}

func (s *Server) goDrain(host string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running["drain/"+host] || !s.leader {
		return // a next term resumes it
	}
	s.running["drain/"+host] = true
	ctx := s.term
	s.wg.Go(func() {
		defer func() { s.mu.Lock(); delete(s.running, "drain/"+host); s.mu.Unlock() }()
		err := s.runDrain(ctx, host)
		if ctx.Err() != nil {
			return // resumed by the next leader
		}
		now := time.Now().UTC()
		Update(ctx, s.store, kindDrain, host, func(d *controlapi.Drain, exists bool) error {
			d.Finished = &now
			if err != nil {
				d.State, d.Error = drainFailed, err.Error()
			} else {
				d.State = drainDone
			}
			return nil
		})
		if err == nil {
			Update(ctx, s.store, kindHost, host, func(h *controlapi.Host, exists bool) error { h.State = controlapi.HostDrained; return nil })
		}
	})
}

// runDrain migrates the plan, at most K at a time, each to its planned
// host, and waits for each migration to end.
func (s *Server) runDrain(ctx context.Context, host string) error {
	d, err := Get[controlapi.Drain](ctx, s.store, kindDrain, host)
	if err != nil {
		return err
	}
	plan := d.Value.Plan
	k := s.cfg.MaxParallelDrain
	var failures []error
	for start := 0; start < len(plan); start += k {
		batch := plan[start:min(start+k, len(plan))]
		errs := make(chan error, len(batch))
		for _, it := range batch {
			go func() { errs <- s.drainOne(ctx, host, it) }()
		}
		for range batch {
			if err := <-errs; err != nil {
				failures = append(failures, err)
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if len(failures) > 0 {
		return errors.Join(failures...)
	}
	// The host is drained once its records show no vmm process left
	// (the agent reports each gone once it exited).
	vmms, err := List[controlapi.VMM](ctx, s.store, kindVMM)
	if err != nil {
		return err
	}
	for _, v := range vmms {
		if v.Value.HostID == host && v.Value.ProcessLive() {
			if err := s.waitVMMEnd(ctx, v.Value.ID); err != nil {
				return fmt.Errorf("vmm %s still runs on host %s: %w", v.Value.ID, host, err)
			}
		}
	}
	return nil
}

// drainOne migrates one instance (unless an earlier run of this drain
// did) and waits for the migration to end.
func (s *Server) drainOne(ctx context.Context, host string, it controlapi.DrainItem) error {
	d, err := Get[controlapi.Drain](ctx, s.store, kindDrain, host)
	if err != nil {
		return err
	}
	migID := d.Value.Migrations[it.InstanceID]
	if migID == "" {
		inst, err := Get[controlapi.Instance](ctx, s.store, kindInstance, it.InstanceID)
		if err != nil {
			return nil // deleted meanwhile
		}
		if inst.Value.MigrationID != "" {
			migID = inst.Value.MigrationID
		} else {
			v, err := Get[controlapi.VMM](ctx, s.store, kindVMM, inst.Value.ActiveVMM)
			if err != nil || v.Value.HostID != host {
				return nil // already off the host
			}
			sg, err := s.StartMigration(ctx, it.InstanceID, it.Target)
			if err != nil {
				return fmt.Errorf("instance %s: %w", it.Name, err)
			}
			migID = sg.MigrationID
		}
		if _, err := Update(ctx, s.store, kindDrain, host, func(d *controlapi.Drain, exists bool) error {
			d.Migrations[it.InstanceID] = migID
			return nil
		}); err != nil {
			return err
		}
	}
	m, err := s.waitMigration(ctx, migID)
	if err != nil {
		return fmt.Errorf("instance %s: %w", it.Name, err)
	}
	if m.State != controlapi.MigrationCompleted {
		return fmt.Errorf("instance %s: migration %s %s: %s", it.Name, m.ID, m.State, m.Error)
	}
	_, err = Update(ctx, s.store, kindDrain, host, func(d *controlapi.Drain, exists bool) error { d.Moved++; return nil })
	return err
}

// migrationWait bounds one drained migration.
const migrationWait = 10 * time.Minute

func (s *Server) waitMigration(ctx context.Context, id string) (controlapi.Migration, error) {
	ctx, cancel := context.WithTimeout(ctx, migrationWait)
	defer cancel()
	for {
		m, err := Get[controlapi.Migration](ctx, s.store, kindMigration, id)
		if err != nil {
			return controlapi.Migration{}, err
		}
		if m.Value.State == controlapi.MigrationCompleted || m.Value.State == controlapi.MigrationFailed {
			return m.Value, nil
		}
		select {
		case <-s.store.Watch(ctx, kindMigration, id, m.Rev):
		case <-ctx.Done():
			return m.Value, fmt.Errorf("waiting for migration %s: %w", id, ctx.Err())
		}
	}
}

func (s *Server) waitVMMEnd(ctx context.Context, id string) error {
	ctx, cancel := context.WithTimeout(ctx, opWait)
	defer cancel()
	for {
		v, err := Get[controlapi.VMM](ctx, s.store, kindVMM, id)
		if err != nil || !v.Value.ProcessLive() {
			return nil
		}
		select {
		case <-s.store.Watch(ctx, kindVMM, id, v.Rev):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
