package downstairs

import (
	"fmt"
	"sync"

	"github.com/google/uuid"

	"tern/volume/ids"
	"tern/volume/wire"
)

// fenceInfo says who fenced a session.
type fenceInfo struct {
	gen ids.Generation
	by  uuid.UUID
}

// fence decides which session may change the region.
//
// mu is held shared by every worker while it applies a mutation (write,
// flush, repair write) and exclusively by a takeover. So a takeover waits
// for mutations already applying, and every mutation that starts after it
// sees the new active session and is refused to the old one: none of the
// old session's writes lands after the takeover.
type fence struct {
	mu     sync.RWMutex
	active *session // guarded by mu: the session allowed to mutate, or nil
}

// activateResult is the outcome of an activation.
type activateResult struct {
	fenced *fenceInfo     // the requester itself was already fenced
	code   wire.ErrorCode // refusal, when refused is set
	msg    string
	ok     bool
}

// activate makes s the active session at gen if gen exceeds every
// generation the region has accepted, storing gen and s's upstairs durably
// first, and fences the previous active session. The upstairs that holds
// the highest generation may activate at it again from a new session (a
// reconnect after an outage or a downstairs restart: it replays its
// backlog); nobody else may. Re-sending the generation s already holds is
// acknowledged again.
func (srv *Server) activate(s *session, gen ids.Generation) activateResult {
	srv.fence.mu.Lock()
	defer srv.fence.mu.Unlock()
	if f := s.fencedBy(); f != nil {
		return activateResult{fenced: f}
	}
	if srv.fence.active == s && s.gen == gen {
		return activateResult{ok: true}
	}
	g, holder := srv.region.GenHolder()
	highest := ids.Generation(g)
	if !MayActivate(gen, s.upstairs, highest, holder) {
		return activateResult{code: wire.CodeGenTooLow, msg: fmt.Sprintf("generation %d is not above %d", gen, highest)}
	}
	if err := srv.region.SetGenHolder(ids.Generation(gen), s.upstairs); err != nil {
		return activateResult{code: codeOf(err), msg: fmt.Sprintf("store generation: %v", err)}
	}
	old := srv.fence.active
	srv.fence.active = s
	s.gen = gen
	if old != nil && old != s {
		old.fence(&fenceInfo{gen: gen, by: s.upstairs})
		srv.metrics.fenced.Inc()
	}
	srv.log.Info("activated", "upstairs", s.upstairs, "session", s.sessionID, "gen", gen)
	return activateResult{ok: true}
}

// MayActivate is the fencing rule: an upstairs may activate a region at
// gen when gen exceeds the highest generation the region has accepted, or
// when it is that generation's holder coming back (a rejoin after an
// outage or a downstairs restart). Everything else is refused with
// CodeGenTooLow. It is a pure decision, shared with the simulator.
func MayActivate(gen ids.Generation, upstairs uuid.UUID, highest ids.Generation, holder uuid.UUID) bool {
	rejoin := gen == highest && holder != uuid.Nil && holder == upstairs
	return gen > highest || rejoin
}

// deactivate forgets s as the active session when it ends. The region
// keeps its highest generation: the next writer must activate above it.
func (srv *Server) deactivate(s *session) {
	srv.fence.mu.Lock()
	defer srv.fence.mu.Unlock()
	if srv.fence.active == s {
		srv.fence.active = nil
	}
}

// isActive reports whether s is the active session.
func (srv *Server) isActive(s *session) bool {
	srv.fence.mu.RLock()
	defer srv.fence.mu.RUnlock()
	return srv.fence.active == s
}
