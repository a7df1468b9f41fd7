package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"tern/control/controlapi"

	"github.com/google/uuid"

	"tern/agent/agentapi"
	"tern/instance/apiv1"
	"tern/instance/runner"
	"tern/internal/httpjson"
)

// Saga states.
const (
	sagaRunning   = "running"
	sagaUnwinding = "unwinding"
	sagaDone      = "done"
	sagaUnwound   = "unwound"
)

// sagaStep is one idempotent step and the undo of what it did.
type sagaStep struct {
	name string
	do   func(*Server, context.Context, *controlapi.MigrateSaga) error
	undo func(*Server, context.Context, *controlapi.MigrateSaga) error
}

// MigrateSteps are the migration saga's steps, in order; the saga ends
// once the target is ensured (the outcome comes from the vmms' reports,
// settled by Settle).
var MigrateSteps = []sagaStep{
	{name: "check_versions", do: (*Server).stepCheckVersions},
	{name: "create_vmm_record", do: (*Server).stepCreateVMM, undo: (*Server).undoCreateVMM},
	{name: "create_migration_record", do: (*Server).stepCreateMigration, undo: (*Server).undoCreateMigration},
	{name: "set_migration_ids", do: (*Server).stepSetIDs, undo: (*Server).undoSetIDs},
	{name: "ensure_target", do: (*Server).stepEnsureTarget, undo: (*Server).undoEnsureTarget},
	{name: "mark_in_progress", do: (*Server).stepMarkInProgress},
}

// StepNames lists MigrateSteps' names.
func StepNames() []string {
	var out []string
	for _, s := range MigrateSteps {
		out = append(out, s.name)
	}
	return out
}

// runSaga drives saga id from its record to done or unwound.
func (s *Server) runSaga(ctx context.Context, id string) error {
	for {
		cur, err := Get[controlapi.MigrateSaga](ctx, s.store, kindSaga, id)
		if err != nil {
			return err
		}
		sg := cur.Value
		switch sg.State {
		case sagaDone, sagaUnwound:
			if sg.State == sagaUnwound {
				return errors.New(sg.Error)
			}
			return nil
		case sagaRunning:
			if sg.StepDone {
				sg.Step++
				sg.StepDone = false
				if sg.Step == len(MigrateSteps) {
					sg.State = sagaDone
				}
				if err := s.store.Commit(ctx, Put(kindSaga, id, &sg, cur.Rev)); err != nil {
					return err
				}
				continue
			}
			step := MigrateSteps[sg.Step]
			s.crashPoint("before:" + step.name)
			err := step.do(s, ctx, &sg)
			s.crashPoint("after:" + step.name)
			next, _ := Get[controlapi.MigrateSaga](ctx, s.store, kindSaga, id)
			if err != nil {
				s.log.Warn("saga step failed: unwinding", "saga", id, "step", step.name, "err", err)
				next.Value.State, next.Value.Error = sagaUnwinding, fmt.Sprintf("%s: %v", step.name, err)
			} else {
				next.Value.StepDone = true
			}
			if err := s.store.Commit(ctx, Put(kindSaga, id, &next.Value, next.Rev)); err != nil {
				return err
			}
		case sagaUnwinding:
			// Undo the step in hand (it may have acted before failing),
			// then each one before it.
			step := MigrateSteps[sg.Step]
			if step.undo != nil {
				if err := step.undo(s, ctx, &sg); err != nil {
					return fmt.Errorf("undoing %s: %w", step.name, err)
				}
			}
			if sg.Step == 0 {
				sg.State = sagaUnwound
			} else {
				sg.Step--
			}
			if err := s.store.Commit(ctx, Put(kindSaga, id, &sg, cur.Rev)); err != nil {
				return err
			}
		}
	}
}

// resume drives every saga and drain in flight (at leadership).
func (s *Server) resume() {
	ctx := s.termCtx()
	sagas, err := List[controlapi.MigrateSaga](ctx, s.store, kindSaga)
	if err != nil && ctx.Err() == nil {
		s.log.Error("listing sagas to resume", "err", err)
	}
	for _, sg := range sagas {
		if sg.Value.State == sagaRunning || sg.Value.State == sagaUnwinding {
			s.log.Info("resuming saga", "saga", sg.Value.ID, "state", sg.Value.State, "step", MigrateSteps[sg.Value.Step].name)
			s.goSaga(sg.Value.ID)
		}
	}
	// Settle every instance: reports may have landed while no one led.
	insts, _ := List[controlapi.Instance](ctx, s.store, kindInstance)
	for _, in := range insts {
		s.settle(ctx, in.Value.ID)
	}
	drains, _ := List[controlapi.Drain](ctx, s.store, kindDrain)
	for _, d := range drains {
		if d.Value.State == drainRunning {
			s.goDrain(d.Value.HostID)
		}
	}
}

// goSaga runs saga id in the background, once per process.
func (s *Server) goSaga(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running["saga/"+id] || !s.leader {
		return // a next term resumes it
	}
	s.running["saga/"+id] = true
	ctx := s.term
	s.wg.Go(func() {
		defer func() { s.mu.Lock(); delete(s.running, "saga/"+id); s.mu.Unlock() }()
		if err := s.runSaga(ctx, id); err != nil && ctx.Err() == nil {
			s.log.Warn("saga ended", "saga", id, "err", err)
		}
	})
}

func (s *Server) migrateInstance(w http.ResponseWriter, r *http.Request) {
	var req controlapi.MigrateRequest
	if err := decodeJSON(r, &req); err != nil {
		writeErr(w, err)
		return
	}
	v, err := s.findInstance(r.Context(), r.PathValue("name"))
	if err != nil {
		writeErr(w, err)
		return
	}
	m, err := s.StartMigration(r.Context(), v.Value.ID, req.To)
	if err != nil {
		writeErr(w, err)
		return
	}
	httpjson.Write(w, http.StatusAccepted, m)
}

// StartMigration checks versions, records a migration saga for the
// instance to host to (placement chooses when empty) and runs it until
// the target is ensured; the saga's record is what a restart resumes.
func (s *Server) StartMigration(ctx context.Context, instID, to string) (controlapi.MigrateSaga, error) {
	cur, err := Get[controlapi.Instance](ctx, s.store, kindInstance, instID)
	if err != nil {
		return controlapi.MigrateSaga{}, err
	}
	inst := cur.Value
	if inst.MigrationID != "" {
		return controlapi.MigrateSaga{}, wrongState("instance %s is already migrating (%s)", inst.Name, inst.MigrationID)
	}
	if inst.ActiveVMM == "" {
		return controlapi.MigrateSaga{}, wrongState("instance %s runs no vmm", inst.Name)
	}
	src, err := Get[controlapi.VMM](ctx, s.store, kindVMM, inst.ActiveVMM)
	if err != nil {
		return controlapi.MigrateSaga{}, err
	}
	if src.Value.Gone || src.Value.State != apiv1.Running {
		return controlapi.MigrateSaga{}, wrongState("instance %s's vmm is %s, not running", inst.Name, src.Value.State)
	}
	if to == src.Value.HostID {
		return controlapi.MigrateSaga{}, badRequest("instance %s already runs on host %s", inst.Name, to)
	}
	if to == "" {
		loads, err := s.loads(ctx)
		if err != nil {
			return controlapi.MigrateSaga{}, err
		}
		if to, err = PlaceVMM(loads, inst.VCPUs, inst.MemoryMiB, src.Value.HostID, "instance "+inst.Name); err != nil {
			return controlapi.MigrateSaga{}, err
		}
	} else if _, err := Get[controlapi.Host](ctx, s.store, kindHost, to); err != nil {
		return controlapi.MigrateSaga{}, badRequest("--to %s: %v", to, err)
	}
	// The versions first: a mismatch is refused before anything starts.
	if err := s.checkVersions(ctx, src.Value.HostID, inst.ActiveVMM, to); err != nil {
		return controlapi.MigrateSaga{}, err
	}
	sg := controlapi.MigrateSaga{ID: "saga-" + uuid.NewString()[:8], InstanceID: inst.ID, MigrationID: "mig-" + uuid.NewString()[:12],
		SourceVMM: inst.ActiveVMM, SourceHost: src.Value.HostID, TargetVMM: "vmm-" + uuid.NewString()[:8], TargetHost: to, State: sagaRunning}
	if err := s.store.Commit(ctx, Put(kindSaga, sg.ID, &sg, 0)); err != nil {
		return controlapi.MigrateSaga{}, err
	}
	s.mu.Lock()
	s.running["saga/"+sg.ID] = true
	s.mu.Unlock()
	err = s.runSaga(ctx, sg.ID)
	s.mu.Lock()
	delete(s.running, "saga/"+sg.ID)
	s.mu.Unlock()
	if err != nil {
		return sg, &apiErr{http.StatusConflict, "migration_refused", fmt.Errorf("migrating instance %s: %w", inst.Name, err)}
	}
	return sg, nil
}

// checkVersions compares the source vmm's version and both agents'
// with the target agent's (its vmms run the same binary).
func (s *Server) checkVersions(ctx context.Context, srcHost, srcVMM, dstHost string) error {
	sa, err := s.agentFor(ctx, srcHost)
	if err != nil {
		return err
	}
	da, err := s.agentFor(ctx, dstHost)
	if err != nil {
		return err
	}
	sv, err := sa.VMMVersion(ctx, srcVMM)
	if err != nil {
		return fmt.Errorf("getting the source vmm's version: %w", err)
	}
	sav, err := sa.Version(ctx)
	if err != nil {
		return fmt.Errorf("getting host %s's version: %w", srcHost, err)
	}
	dv, err := da.Version(ctx)
	if err != nil {
		return fmt.Errorf("getting host %s's version: %w", dstHost, err)
	}
	var errs []error
	if err := runner.CheckMigrationVersions(sv, dv); err != nil {
		errs = append(errs, fmt.Errorf("vmm %s → host %s: %w", srcVMM, dstHost, err))
	}
	if err := runner.CheckMigrationVersions(sav, dv); err != nil {
		errs = append(errs, fmt.Errorf("host %s → host %s: %w", srcHost, dstHost, err))
	}
	if len(errs) > 0 {
		return &apiErr{http.StatusConflict, "incompatible", errors.Join(errs...)}
	}
	return nil
}

func (s *Server) stepCheckVersions(ctx context.Context, sg *controlapi.MigrateSaga) error {
	return s.checkVersions(ctx, sg.SourceHost, sg.SourceVMM, sg.TargetHost)
}

func (s *Server) stepCreateVMM(ctx context.Context, sg *controlapi.MigrateSaga) error {
	inst, err := Get[controlapi.Instance](ctx, s.store, kindInstance, sg.InstanceID)
	if err != nil {
		return err
	}
	loads, err := s.loads(ctx)
	if err != nil {
		return err
	}
	_, err = Update(ctx, s.store, kindVMM, sg.TargetVMM, func(v *controlapi.VMM, exists bool) error {
		if exists {
			return nil
		}
		for _, l := range loads {
			if l.ID == sg.TargetHost && !l.fits(inst.Value.VCPUs, inst.Value.MemoryMiB) {
				return &ErrNoCapacity{What: fmt.Sprintf("instance %s on host %s", inst.Value.Name, sg.TargetHost)}
			}
		}
		*v = controlapi.VMM{ID: sg.TargetVMM, InstanceID: sg.InstanceID, HostID: sg.TargetHost, VCPUs: inst.Value.VCPUs,
			MemoryMiB: inst.Value.MemoryMiB, Created: time.Now().UTC()}
		return nil
	})
	return err
}

func (s *Server) undoCreateVMM(ctx context.Context, sg *controlapi.MigrateSaga) error {
	_, err := Update(ctx, s.store, kindVMM, sg.TargetVMM, func(v *controlapi.VMM, exists bool) error {
		if !exists {
			return errSkip
		}
		v.Unwound = true
		return nil
	})
	return skipOK(err)
}

// errSkip abandons an Update that has nothing to do.
var errSkip = errors.New("nothing to do")

func skipOK(err error) error {
	if errors.Is(err, errSkip) {
		return nil
	}
	return err
}

func (s *Server) stepCreateMigration(ctx context.Context, sg *controlapi.MigrateSaga) error {
	_, err := Update(ctx, s.store, kindMigration, sg.MigrationID, func(m *controlapi.Migration, exists bool) error {
		if exists {
			return errSkip
		}
		*m = controlapi.Migration{ID: sg.MigrationID, InstanceID: sg.InstanceID, State: controlapi.MigrationPending, SourceVMM: sg.SourceVMM,
			TargetVMM: sg.TargetVMM, SourceHost: sg.SourceHost, TargetHost: sg.TargetHost, Started: time.Now().UTC()}
		return nil
	})
	return skipOK(err)
}

func (s *Server) undoCreateMigration(ctx context.Context, sg *controlapi.MigrateSaga) error {
	_, err := Update(ctx, s.store, kindMigration, sg.MigrationID, func(m *controlapi.Migration, exists bool) error {
		if !exists || m.State == controlapi.MigrationCompleted || m.State == controlapi.MigrationFailed {
			return errSkip
		}
		now := time.Now().UTC()
		m.State, m.Finished, m.Error = controlapi.MigrationFailed, &now, "the migration saga unwound"
		return nil
	})
	return skipOK(err)
}

func (s *Server) stepSetIDs(ctx context.Context, sg *controlapi.MigrateSaga) error {
	_, err := Update(ctx, s.store, kindInstance, sg.InstanceID, func(i *controlapi.Instance, exists bool) error {
		if !exists {
			return ErrNotFound
		}
		if i.MigrationID == sg.MigrationID {
			return errSkip
		}
		if i.MigrationID != "" || i.ActiveVMM != sg.SourceVMM {
			return wrongState("instance %s changed: vmm %s, migration %q", i.Name, i.ActiveVMM, i.MigrationID)
		}
		i.MigrationID, i.TargetVMM = sg.MigrationID, sg.TargetVMM
		return nil
	})
	return skipOK(err)
}

func (s *Server) undoSetIDs(ctx context.Context, sg *controlapi.MigrateSaga) error {
	_, err := Update(ctx, s.store, kindInstance, sg.InstanceID, func(i *controlapi.Instance, exists bool) error {
		if !exists || i.MigrationID != sg.MigrationID {
			return errSkip
		}
		i.MigrationID, i.TargetVMM = "", ""
		return nil
	})
	return skipOK(err)
}

// targetEnsured reports whether an earlier run of ensure_target got the
// target going: its vmm has reported, or its agent runs it. A replay
// after a crash must neither re-ensure nor tear down such a target: the
// migration may have completed while no control process led.
func (s *Server) targetEnsured(ctx context.Context, sg *controlapi.MigrateSaga) bool {
	if v, err := Get[controlapi.VMM](ctx, s.store, kindVMM, sg.TargetVMM); err == nil && v.Value.Gen > 0 {
		return true
	}
	da, err := s.agentFor(ctx, sg.TargetHost)
	if err != nil {
		return false
	}
	st, err := da.VMM(ctx, sg.TargetVMM)
	return err == nil && !st.Gone
}

func (s *Server) stepEnsureTarget(ctx context.Context, sg *controlapi.MigrateSaga) error {
	if s.targetEnsured(ctx, sg) {
		return nil
	}
	inst, err := Get[controlapi.Instance](ctx, s.store, kindInstance, sg.InstanceID)
	if err != nil {
		return err
	}
	sa, err := s.agentFor(ctx, sg.SourceHost)
	if err != nil {
		return err
	}
	src, err := sa.VMM(ctx, sg.SourceVMM)
	if err != nil {
		return fmt.Errorf("getting the source vmm: %w", err)
	}
	if src.MigrationAddr == "" {
		return fmt.Errorf("the source vmm %s reports no migration address", sg.SourceVMM)
	}
	spec := runner.MigrationTargetSpec{ID: sg.InstanceID,
		Init: runner.MigrationInit{Method: apiv1.InitMigrationTarget, Source: src.MigrationAddr, MigrationID: sg.MigrationID}}
	body, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	da, err := s.agentFor(ctx, sg.TargetHost)
	if err != nil {
		return err
	}
	_, err = da.EnsureVMM(ctx, sg.TargetVMM, agentapi.EnsureVMM{InstanceID: sg.InstanceID, VCPUs: inst.Value.VCPUs,
		MemoryMiB: inst.Value.MemoryMiB, Spec: body})
	if err != nil {
		return fmt.Errorf("ensuring the target vmm on host %s: %w", sg.TargetHost, err)
	}
	return nil
}

func (s *Server) undoEnsureTarget(ctx context.Context, sg *controlapi.MigrateSaga) error {
	if m, err := Get[controlapi.Migration](ctx, s.store, kindMigration, sg.MigrationID); err == nil && m.Value.State == controlapi.MigrationCompleted {
		return nil
	}
	if v, err := Get[controlapi.VMM](ctx, s.store, kindVMM, sg.TargetVMM); err == nil && !v.Value.Gone && v.Value.State == apiv1.Running {
		return nil // the target runs: Settle completes the migration
	}
	da, err := s.agentFor(ctx, sg.TargetHost)
	if err != nil {
		return err
	}
	return da.DeleteVMM(ctx, sg.TargetVMM)
}

func (s *Server) stepMarkInProgress(ctx context.Context, sg *controlapi.MigrateSaga) error {
	_, err := Update(ctx, s.store, kindMigration, sg.MigrationID, func(m *controlapi.Migration, exists bool) error {
		if !exists || m.State != controlapi.MigrationPending {
			return errSkip
		}
		m.State = controlapi.MigrationInProgress
		return nil
	})
	if err := skipOK(err); err != nil {
		return err
	}
	s.settle(ctx, sg.InstanceID)
	return nil
}
