package control

import (
	"context"
	"errors"
	"time"

	"tern/control/controlapi"

	"tern/agent/agentapi"
	"tern/instance/apiv1"
)

func half(p *apiv1.Progress) *controlapi.MigrationHalf {
	if p == nil {
		return nil
	}
	return &controlapi.MigrationHalf{ID: p.ID, Phase: p.Phase.String(), BytesSent: p.BytesSent, Round: uint64(p.Round), Error: p.Error,
		TotalMs: p.TotalMs, DowntimeMs: p.DowntimeMs}
}

// ApplyReport records a vmm's report if it is newer than the record's
// (by the vmm's generation; a gone report is final) and settles its
// instance. It reports whether the record changed.
func (s *Server) ApplyReport(ctx context.Context, rep agentapi.Report) (bool, error) {
	applied := true
	v, err := Update(ctx, s.store, kindVMM, rep.VMMID, func(v *controlapi.VMM, exists bool) error {
		switch {
		case !exists:
			return ErrNotFound
		case v.HostID != rep.HostID:
			return badRequest("vmm %s is on host %s, not %s", rep.VMMID, v.HostID, rep.HostID)
		case v.Gone || rep.Gen <= v.Gen:
			applied = false
			return errSkip
		}
		v.Gen, v.State, v.Gone = rep.Gen, rep.State, rep.Gone
		if rep.In != nil || !rep.Gone {
			v.In = half(rep.In)
		}
		if rep.Out != nil || !rep.Gone {
			v.Out = half(rep.Out)
		}
		return nil
	})
	if errors.Is(err, errSkip) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	s.settle(ctx, v.InstanceID)
	return applied, nil
}

// sideReport is a vmm record as Settle reads it for migration id, with
// its half for that migration (in or out).
func sideReport(v *controlapi.VMM, id string, out bool) SideReport {
	if v == nil {
		return SideReport{}
	}
	r := SideReport{Reported: v.Gen > 0, State: v.State, Gone: v.Gone}
	h := v.In
	if out {
		h = v.Out
	}
	if h != nil && h.ID == id {
		r.Phase = h.Phase
	}
	return r
}

// settle applies the end-of-migration rules (or, outside a migration,
// the active vmm's end) to the instance's records, then destroys what
// they say to and pushes the new network mapping. Errors are logged: the
// next report or a restart settles again.
func (s *Server) settle(ctx context.Context, instID string) {
	for range 20 {
		err := s.settleOnce(ctx, instID)
		if !errors.Is(err, ErrConflict) {
			if err != nil && !errors.Is(err, ErrNotFound) {
				s.log.Warn("settling instance", "instance", instID, "err", err)
			}
			return
		}
	}
}

func (s *Server) settleOnce(ctx context.Context, instID string) error {
	cur, err := Get[controlapi.Instance](ctx, s.store, kindInstance, instID)
	if err != nil {
		return err
	}
	inst := cur.Value
	var src *controlapi.VMM
	if inst.ActiveVMM != "" {
		if v, err := Get[controlapi.VMM](ctx, s.store, kindVMM, inst.ActiveVMM); err == nil {
			src = &v.Value
		}
	}
	if inst.MigrationID == "" {
		if src == nil || !(src.Gone || src.State == apiv1.Destroyed || src.State == apiv1.Failed) {
			return nil
		}
		// The active vmm ended: the instance has none.
		inst.Failed = !(inst.Intent == controlapi.IntentStopped && !(src.State == apiv1.Failed))
		inst.ActiveVMM = ""
		return s.store.Commit(ctx, Put(kindInstance, instID, &inst, cur.Rev))
	}
	mcur, err := Get[controlapi.Migration](ctx, s.store, kindMigration, inst.MigrationID)
	if err != nil {
		return err
	}
	m := mcur.Value
	var dst *controlapi.VMM
	if v, err := Get[controlapi.VMM](ctx, s.store, kindVMM, inst.TargetVMM); err == nil {
		dst = &v.Value
	}
	sr, dr := sideReport(src, m.ID, true), sideReport(dst, m.ID, false)
	o, live := NextOutcome(m.State, sr, dr)
	if !live {
		return nil
	}
	if src != nil {
		m.SourceGen = src.Gen
	}
	if dst != nil {
		m.TargetGen = dst.Gen
	}
	for _, h := range []*controlapi.MigrationHalf{halfOf(dst, false, m.ID), halfOf(src, true, m.ID)} {
		if h != nil {
			m.BytesSent, m.Rounds = max(m.BytesSent, h.BytesSent), max(m.Rounds, h.Round)
			m.TotalMs, m.DowntimeMs = max(m.TotalMs, h.TotalMs), max(m.DowntimeMs, h.DowntimeMs)
			if h.Error != "" && m.Error == "" {
				m.Error = h.Error
			}
		}
	}
	writes := []Write{}
	if !o.Terminal() {
		if o.Migration == controlapi.MigrationInProgress && m.State == controlapi.MigrationPending {
			m.State = controlapi.MigrationInProgress
		}
		return s.store.Commit(ctx, Put(kindMigration, m.ID, &m, mcur.Rev))
	}
	now := time.Now().UTC()
	m.State, m.Finished = o.Migration, &now
	if o.Migration == controlapi.MigrationFailed && m.Error == "" {
		m.Error = o.Reason
	}
	target := inst.TargetVMM
	source := inst.ActiveVMM
	switch InstanceSide(o, sr, dr) {
	case ActiveTarget:
		inst.ActiveVMM = target
	case ActiveSource:
	case ActiveNone:
		inst.ActiveVMM, inst.Failed = "", true
	}
	inst.MigrationID, inst.TargetVMM = "", ""
	if inst.Volume != nil {
		inst.Volume.Gen++ // the target activated at the source's + 1
	}
	writes = append(writes, Put(kindInstance, instID, &inst, cur.Rev), Put(kindMigration, m.ID, &m, mcur.Rev))
	if o.Migration == controlapi.MigrationCompleted {
		if h, err := Get[controlapi.Host](ctx, s.store, kindHost, m.TargetHost); err == nil {
			writes = append(writes, Write{Kind: kindV2P, ID: instID, Unconditional: true,
				Value: &controlapi.V2P{V2PKey: inst.Network, InstanceID: instID, HostID: m.TargetHost, HostAddress: h.Value.Address}})
		}
	}
	if err := s.store.Commit(ctx, writes...); err != nil {
		return err
	}
	s.log.Info("migration settled", "migration", m.ID, "instance", inst.Name, "state", m.State, "reason", o.Reason)
	if o.DestroySource {
		s.destroyVMM(ctx, m.SourceHost, source)
	}
	if o.DestroyTarget {
		s.destroyVMM(ctx, m.TargetHost, target)
	}
	go s.pushV2P(s.ctx)
	return nil
}

func halfOf(v *controlapi.VMM, out bool, id string) *controlapi.MigrationHalf {
	if v == nil {
		return nil
	}
	h := v.In
	if out {
		h = v.Out
	}
	if h == nil || h.ID != id {
		return nil
	}
	return h
}

// destroyVMM asks host's agent to stop vmm (idempotent).
func (s *Server) destroyVMM(ctx context.Context, host, vmm string) {
	a, err := s.agentFor(ctx, host)
	if err == nil {
		err = a.DeleteVMM(ctx, vmm)
	}
	if err != nil {
		s.log.Warn("destroying a vmm", "vmm", vmm, "host", host, "err", err)
	}
}
