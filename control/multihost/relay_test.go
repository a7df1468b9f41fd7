package multihost

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"reflect"
	"sync"
	"testing"
	"time"

	"tern/control/controlapi"

	"tern/agent/agentapi"
	"tern/instance/apiv1"
)

// faultyRelay stands between the agents and the control plane: it
// forwards every request but the vmm reports, which it takes at once
// (so the agent's sender moves on) and delivers to the control plane's
// report endpoint itself: late, some twice, in a seeded-random order.
type faultyRelay struct {
	t       *testing.T
	control string
	srv     *http.Server
	done    chan struct{}

	mu sync.Mutex
	// rng, pending (taken, not yet delivered), seen (every report taken,
	// in arrival order), newest (each vmm's highest generation
	// delivered) and the fault counts are guarded by mu; changed is
	// closed and replaced when pending changes.
	rng         *rand.Rand
	pending     []agentapi.Report
	seen        []agentapi.Report
	newest      map[string]apiv1.ViewGen
	late, twice int
	changed     chan struct{}
	closed      bool
}

// maxLate bounds how late the relay delivers a report.
const maxLate = 150 * time.Millisecond

func newFaultyRelay(t *testing.T, seed uint64) *faultyRelay {
	r := &faultyRelay{t: t, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), newest: map[string]apiv1.ViewGen{},
		changed: make(chan struct{}), done: make(chan struct{})}
	return r
}

// start serves the relay to controlURL and returns its own URL.
func (r *faultyRelay) start(controlURL string) string {
	r.control = controlURL
	u, err := url.Parse(controlURL)
	if err != nil {
		r.t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(u)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/reports", r.take)
	mux.Handle("/", proxy)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		r.t.Fatal(err)
	}
	r.srv = &http.Server{Handler: mux}
	go r.srv.Serve(ln)
	go r.deliverLoop()
	r.t.Cleanup(r.close)
	return "http://" + ln.Addr().String()
}

func (r *faultyRelay) close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.signalLocked()
	r.mu.Unlock()
	r.srv.Close()
	<-r.done
}

func (r *faultyRelay) signalLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// take accepts a report from an agent for later delivery.
func (r *faultyRelay) take(w http.ResponseWriter, req *http.Request) {
	var rep agentapi.Report
	if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&rep); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	r.pending = append(r.pending, rep)
	r.seen = append(r.seen, rep)
	r.signalLocked()
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"applied":true}`)
}

// deliverLoop delivers pending reports one at a time, each after a
// random delay, picked at random among those pending; a third of them
// are kept to be delivered again later.
func (r *faultyRelay) deliverLoop() {
	defer close(r.done)
	for {
		r.mu.Lock()
		for len(r.pending) == 0 && !r.closed {
			ch := r.changed
			r.mu.Unlock()
			<-ch
			r.mu.Lock()
		}
		if r.closed {
			r.mu.Unlock()
			return
		}
		delay := time.Duration(r.rng.Int64N(int64(maxLate)))
		r.mu.Unlock()
		// The fault: the report is late by delay.
		<-time.After(delay)
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		i := r.rng.IntN(len(r.pending))
		rep := r.pending[i]
		r.pending = append(r.pending[:i], r.pending[i+1:]...)
		again := r.rng.IntN(3) == 0
		r.mu.Unlock()
		err := r.deliver(rep)
		r.mu.Lock()
		if err != nil || again {
			r.pending = append(r.pending, rep)
			if err == nil {
				r.twice++
			}
		}
		r.signalLocked()
		r.mu.Unlock()
	}
}

// deliver posts rep to the control plane's report endpoint and counts
// it late when its vmm had a newer one delivered.
func (r *faultyRelay) deliver(rep agentapi.Report) error {
	b, _ := json.Marshal(rep)
	resp, err := http.Post(r.control+"/v1/reports", "application/json", bytes.NewReader(b))
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST /v1/reports: %s: %s", resp.Status, msg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.newest[rep.VMMID] > rep.Gen {
		r.late++
	}
	r.newest[rep.VMMID] = max(r.newest[rep.VMMID], rep.Gen)
	return nil
}

// flush waits until every report taken was delivered.
func (r *faultyRelay) flush() {
	r.t.Helper()
	deadline := time.After(generous)
	for {
		r.mu.Lock()
		n, ch := len(r.pending), r.changed
		r.mu.Unlock()
		if n == 0 {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			r.t.Fatalf("the relay still holds %d reports", n)
		}
	}
}

// replayAll delivers every report ever taken again, newest first, then
// in a random order.
func (r *faultyRelay) replayAll() {
	r.t.Helper()
	r.mu.Lock()
	all := append([]agentapi.Report(nil), r.seen...)
	r.mu.Unlock()
	for i := len(all) - 1; i >= 0; i-- {
		if err := r.deliver(all[i]); err != nil {
			r.t.Fatal(err)
		}
	}
	r.mu.Lock()
	r.rng.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	r.mu.Unlock()
	for _, rep := range all {
		if err := r.deliver(rep); err != nil {
			r.t.Fatal(err)
		}
	}
}

// records is what the control plane shows of its records.
type records struct {
	Instances  []controlapi.InstanceView
	Migrations []controlapi.Migration
	Hosts      []controlapi.HostView
}

func (c *cluster) records() records {
	c.t.Helper()
	var r records
	c.mustCtl(&r.Instances, "instance", "list")
	c.mustCtl(&r.Migrations, "migration", "list")
	c.mustCtl(&r.Hosts, "host", "list")
	return r
}

// TestReportsLateTwiceAndOutOfOrderEndTheSame runs the agents' reports
// through a relay that delivers them late, some twice, out of order,
// while two instances start, one migrates and the other stops; the
// migration completes, the records agree with the agents, and
// delivering every report again (newest first, then shuffled) leaves
// the records as they were.
func TestReportsLateTwiceAndOutOfOrderEndTheSame(t *testing.T) {
	relay := newFaultyRelay(t, uint64(time.Now().UnixNano()))
	c := newClusterWith(t, clusterOptions{controlIP: "127.0.0.1", hosts: loopbackHosts, relay: relay.start})
	a := c.createDirty("r1")
	b := c.createDirty("r2")
	from, _ := c.waitRunning("r1")
	c.waitRunning("r2")
	// The agents say running at once; the control plane hears it only
	// when the relay delivers, and refuses to migrate a vmm it still
	// knows as starting (the test raced it once in CI).
	relay.flush()
	to := c.otherHost(from)
	c.mustCtl(nil, "instance", "migrate", "r1", "--to", to)
	c.mustCtl(nil, "instance", "stop", "r2")
	relay.flush()

	host, url := c.settled(a.ID)
	if host != to {
		t.Fatalf("r1 runs on %q after its migration to %s", host, to)
	}
	waitVerifyPass(t, url, "after the migration")
	if vs := vmmsOf(c.waitAgents("the agents", func(map[string]agentapi.Inventory) bool { return true }), b.ID); len(vs) != 0 {
		t.Fatalf("the stopped r2 still has vmms %+v", vs)
	}
	before := c.records()
	for _, m := range before.Migrations {
		if m.State != controlapi.MigrationCompleted {
			t.Fatalf("migration %+v did not complete", m)
		}
	}
	for _, v := range before.Instances {
		if v.Name == "r2" && v.State != "stopped" {
			t.Fatalf("r2's record after its stop: %+v", v)
		}
	}

	relay.mu.Lock()
	liveLate := relay.late
	relay.mu.Unlock()
	relay.replayAll()
	after := c.records()
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("the records changed when every report was delivered again:\nbefore %+v\nafter  %+v", before, after)
	}
	c.neverTwoRunning()
	relay.mu.Lock()
	defer relay.mu.Unlock()
	t.Logf("%d reports, %d delivered twice, %d delivered after a newer one of their vmm (%d before the replay)",
		len(relay.seen), relay.twice, relay.late, liveLate)
	if relay.twice == 0 || relay.late == 0 {
		t.Fatal("the relay injected no duplicate or no late delivery")
	}
}
