package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"tern/agent/agentapi"
)

// queueLocked keeps rep as its vmm's newest unsent report, unless a newer
// one is already waiting, and wakes the sender.
func (a *Agent) queueLocked(rep agentapi.Report) {
	if a.cfg.Control == "" {
		return
	}
	if old, ok := a.pending[rep.VMMID]; ok && old.Gen >= rep.Gen {
		return
	}
	a.pending[rep.VMMID] = rep
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// Retry bounds for talking to the control plane: it may be restarting.
const (
	retryMin = 50 * time.Millisecond
	retryMax = 2 * time.Second
)

// sendReports posts the pending reports to the control plane, each until
// it is taken; a newer report of the same vmm replaces one not yet sent.
func (a *Agent) sendReports() {
	defer a.wg.Done()
	backoff := retryMin
	for {
		a.mu.Lock()
		var batch []agentapi.Report
		for _, r := range a.pending {
			batch = append(batch, r)
		}
		a.mu.Unlock()
		if len(batch) == 0 {
			select {
			case <-a.wake:
				continue
			case <-a.ctx.Done():
				return
			}
		}
		failed := false
		for _, r := range batch {
			if err := a.post(a.ctx, "/v1/reports", r); err != nil {
				a.log.Warn("relaying a vmm report", "vmm", r.VMMID, "gen", r.Gen, "err", err)
				failed = true
				continue
			}
			a.mu.Lock()
			if cur, ok := a.pending[r.VMMID]; ok && cur.Gen == r.Gen {
				delete(a.pending, r.VMMID)
			}
			a.mu.Unlock()
		}
		if !failed {
			backoff = retryMin
			continue
		}
		select {
		case <-time.After(backoff):
		case <-a.ctx.Done():
			return
		}
		backoff = min(2*backoff, retryMax)
	}
}

// register tells the control plane about this host, retrying until it
// answers.
func (a *Agent) register() {
	defer a.wg.Done()
	var protos []uint16
	for _, v := range a.cfg.Version.MigrationProtocols {
		protos = append(protos, uint16(v))
	}
	backoff := retryMin
	for {
		reg := agentapi.Registration{Address: a.cfg.Address, CPUs: a.cfg.CPUs, MemoryMiB: a.cfg.MemoryMiB,
			Build: a.cfg.Version.Build, MigrationProtocols: protos, VMMs: []string{}}
		a.mu.Lock()
		for id := range a.vmms {
			reg.VMMs = append(reg.VMMs, id)
		}
		a.mu.Unlock()
		if a.cfg.Plane != nil {
			reg.Underlay = a.cfg.Underlay.String()
		}
		err := a.put(a.ctx, "/v1/hosts/"+url.PathEscape(a.cfg.HostID), reg)
		if err == nil {
			a.log.Info("registered with the control plane", "control", a.cfg.Control)
			a.mu.Lock()
			a.registered = true
			a.changedLocked()
			a.mu.Unlock()
			return
		}
		a.log.Warn("registering with the control plane", "err", err)
		select {
		case <-time.After(backoff):
		case <-a.ctx.Done():
			return
		}
		backoff = min(2*backoff, retryMax)
	}
}

func (a *Agent) post(ctx context.Context, path string, body any) error {
	return a.send(ctx, http.MethodPost, path, body)
}

func (a *Agent) put(ctx context.Context, path string, body any) error {
	return a.send(ctx, http.MethodPut, path, body)
}

func (a *Agent) send(ctx context.Context, method, path string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, a.cfg.Control+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.cfg.ControlHTTP.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return nil
}
