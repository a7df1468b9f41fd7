package multihost

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"tern/control/controlapi"

	"tern/agent/agentapi"
	"tern/control/internal/proctest"
	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/tlsconf"
	"tern/vmm/guests"
	"tern/vmm/kvm/kvmtest"
)

func TestMain(m *testing.M) {
	kvmtest.Main(m, kvmtest.WithTern("tern-control", "tern-agent"))
}

// generous bounds every wait; nothing asserts on time.
const generous = 3 * time.Minute

// start runs tern args with env and waits for its "listening on URL".
func start(t testing.TB, name string, env []string, args ...string) *proctest.Proc {
	t.Helper()
	return proctest.Start(t, kvmtest.Tern(t), "", name, env, args...)
}

// hostSpec is one host of a cluster: its id, the IP its agent listens
// on, and its network namespace ("" for this one).
type hostSpec struct {
	id, ip, ns string
}

// cluster is a control plane and three agents.
type cluster struct {
	t         testing.TB
	dir       string
	certs     string
	controlIP string
	hosts     map[string]hostSpec
	control   *proctest.Proc
	// agentControl is the URL the agents reach the control plane by.
	agentControl string
	// mu guards agents: a restarted agent replaces its proc.
	mu     sync.Mutex
	agents map[string]*proctest.Proc
	watch  *agentWatch
}

// loopbackHosts are three hosts on distinct loopback addresses.
var loopbackHosts = []hostSpec{{"h2", "127.0.0.2", ""}, {"h3", "127.0.0.3", ""}, {"h4", "127.0.0.4", ""}}

func newCluster(t testing.TB, controlEnv ...string) *cluster {
	t.Helper()
	return newClusterWith(t, clusterOptions{controlIP: "127.0.0.1", hosts: loopbackHosts, controlEnv: controlEnv})
}

// clusterOptions say where a cluster's processes run.
type clusterOptions struct {
	// controlIP is where tern control listens; hosts the agents.
	controlIP string
	hosts     []hostSpec
	// controlEnv is tern control's extra environment.
	controlEnv []string
	// relay, when set, is given the control plane's URL and returns
	// the URL the agents are to reach it by.
	relay func(controlURL string) string
}

// newClusterWith starts tern control and an agent per host, and waits
// for every agent to have registered.
func newClusterWith(t testing.TB, o clusterOptions) *cluster {
	t.Helper()
	kvmtest.Require(t)
	controlIP, hosts, controlEnv := o.controlIP, o.hosts, o.controlEnv
	c := &cluster{t: t, dir: t.TempDir(), controlIP: controlIP, hosts: map[string]hostSpec{}, agents: map[string]*proctest.Proc{}}
	ips := []string{"127.0.0.1", controlIP}
	for _, h := range hosts {
		c.hosts[h.id] = h
		ips = append(ips, h.ip)
	}
	c.certs = filepath.Join(c.dir, "certs")
	if err := tlsconf.Generate(c.certs, ips, false); err != nil {
		t.Fatal(err)
	}
	c.startControl(controlEnv...)
	c.agentControl = c.control.URL
	if o.relay != nil {
		c.agentControl = o.relay(c.control.URL)
	}
	for _, h := range hosts {
		c.startAgent(h.id, h.ip+":0")
	}
	c.watch = watchAgents(t, c)
	// Registration is asynchronous: wait for every agent to say it was
	// taken.
	c.waitAgents("every agent registered", func(inv map[string]agentapi.Inventory) bool {
		n := 0
		for _, i := range inv {
			if i.Registered {
				n++
			}
		}
		return n == len(hosts)
	})
	return c
}

// startAgent (re)starts host id's agent listening on listen.
func (c *cluster) startAgent(id, listen string) {
	h := c.hosts[id]
	p := proctest.Start(c.t, kvmtest.Tern(c.t), h.ns, "agent "+id, nil, "agent", "--listen", listen, "--data-dir", filepath.Join(c.dir, id),
		"--certs", c.certs, "--control", c.agentControl, "--id", id, "--cpus", "8", "--memory", "2GiB")
	c.mu.Lock()
	c.agents[id] = p
	c.mu.Unlock()
}

func (c *cluster) agent(id string) *proctest.Proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.agents[id]
}

// restartAgent SIGKILLs host id's agent (its vmms die with it) and starts
// it again on the same address and data directory.
func (c *cluster) restartAgent(id string) {
	old := c.agent(id)
	old.Kill()
	c.watch.forget(id)
	c.startAgent(id, strings.TrimPrefix(old.URL, "http://"))
}

// startControl (re)starts tern control on the cluster's data dir at a
// fixed port, so agents keep reaching it across restarts.
func (c *cluster) startControl(env ...string) {
	addr := c.controlIP + ":0"
	if c.control != nil {
		addr = strings.TrimPrefix(c.control.URL, "http://")
	}
	c.control = start(c.t, "control", env, "control", "--listen", addr, "--data-dir", filepath.Join(c.dir, "control"), "--certs", c.certs)
}

// ctl runs tern ctl and decodes its --json output into out.
func (c *cluster) ctl(out any, args ...string) error {
	cmd := exec.Command(kvmtest.Tern(c.t), append([]string{"ctl", "--control", c.control.URL, "--json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("tern ctl %v: %v: %s%s", args, err, stderr.String(), stdout.String())
	}
	if out == nil {
		return nil
	}
	// drain prints JSON lines: keep the last.
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	return json.Unmarshal([]byte(lines[len(lines)-1]), out)
}

func (c *cluster) mustCtl(out any, args ...string) {
	c.t.Helper()
	if err := c.ctl(out, args...); err != nil {
		c.t.Fatal(err)
	}
}

// agentWatch follows every agent's inventory by its long-poll and keeps
// the latest of each; on every change it checks, from the agents' own
// reports, that no instance runs on two vmms at once.
type agentWatch struct {
	mu sync.Mutex
	// inv is each reachable agent's latest inventory; changed is closed
	// and replaced at every change; violations lists each time an
	// instance ran on two vmms (all guarded by mu).
	inv        map[string]agentapi.Inventory
	changed    chan struct{}
	violations []string
}

// watchAgents follows c's agents until t ends.
func watchAgents(t testing.TB, c *cluster) *agentWatch {
	w := &agentWatch{inv: map[string]agentapi.Inventory{}, changed: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for id := range c.hosts {
		wg.Go(func() { w.follow(ctx, c, id) })
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
	return w
}

// follow long-polls host id's agent (whichever process it is now).
func (w *agentWatch) follow(ctx context.Context, c *cluster, id string) {
	var gen agentapi.InventoryGen
	var from *proctest.Proc
	for ctx.Err() == nil {
		p := c.agent(id)
		if p != from {
			from, gen = p, 0
		}
		inv, err := agentapi.NewClient(p.URL, nil).InventoryAfter(ctx, gen)
		if err != nil {
			w.forget(id)
			// The agent is down or restarting: ask again shortly.
			select {
			case <-time.After(100 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		if inv.Gen == gen && gen != 0 {
			continue // the long-poll's bound passed with no change
		}
		gen = inv.Gen
		w.update(id, &inv)
	}
}

// forget drops host id's inventory: its agent is not there.
func (w *agentWatch) forget(id string) { w.update(id, nil) }

func (w *agentWatch) update(id string, inv *agentapi.Inventory) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if inv == nil {
		delete(w.inv, id)
	} else {
		w.inv[id] = *inv
	}
	running := map[string][]string{}
	for h, i := range w.inv {
		for _, v := range i.VMMs {
			if !v.Gone && v.State == apiv1.Running {
				running[v.InstanceID] = append(running[v.InstanceID], h+"/"+v.ID)
			}
		}
	}
	for inst, vs := range running {
		if len(vs) > 1 {
			w.violations = append(w.violations, fmt.Sprintf("instance %s ran on %v at once", inst, vs))
		}
	}
	close(w.changed)
	w.changed = make(chan struct{})
}

// waitAgents waits until done accepts the agents' latest inventories.
func (c *cluster) waitAgents(what string, done func(map[string]agentapi.Inventory) bool) map[string]agentapi.Inventory {
	c.t.Helper()
	deadline := time.After(generous)
	for {
		w := c.watch
		w.mu.Lock()
		snap := maps.Clone(w.inv)
		changed := w.changed
		w.mu.Unlock()
		if done(snap) {
			return snap
		}
		select {
		case <-changed:
		case <-deadline:
			c.t.Fatalf("waiting for %s: the agents report %+v", what, snap)
		}
	}
}

// neverTwoRunning fails t if any instance ever ran on two vmms at once,
// by the agents' reports.
func (c *cluster) neverTwoRunning() {
	c.t.Helper()
	c.watch.mu.Lock()
	defer c.watch.mu.Unlock()
	if len(c.watch.violations) > 0 {
		c.t.Fatalf("by the agents' reports: %v", c.watch.violations)
	}
}

// runningIn returns, from inventories, every vmm of instance id that
// runs, by host.
func runningIn(inv map[string]agentapi.Inventory, id string) map[string]agentapi.VMMStatus {
	out := map[string]agentapi.VMMStatus{}
	for h, i := range inv {
		for _, v := range i.VMMs {
			if v.InstanceID == id && !v.Gone && v.State == apiv1.Running {
				out[h] = v
			}
		}
	}
	return out
}

// vmmsOf returns every vmm of instance id the agents have, running or not.
func vmmsOf(inv map[string]agentapi.Inventory, id string) map[string]agentapi.VMMStatus {
	out := map[string]agentapi.VMMStatus{}
	for h, i := range inv {
		for _, v := range i.VMMs {
			if v.InstanceID == id {
				out[h+"/"+v.ID] = v
			}
		}
	}
	return out
}

func (c *cluster) inventory(host string) agentapi.Inventory {
	c.t.Helper()
	inv, err := agentapi.NewClient(c.agent(host).URL, nil).Inventory(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	return inv
}

// runningVMMs returns, from the agents' own current reports, every vmm
// of instance id that runs, by host.
func (c *cluster) runningVMMs(id string) map[string]agentapi.VMMStatus {
	inv := map[string]agentapi.Inventory{}
	for h := range c.hosts {
		inv[h] = c.inventory(h)
	}
	return runningIn(inv, id)
}

// dirtySize is the dirty guest's memory and working set here.
func dirtySize() (memMiB, guestMiB, workingMiB uint64) {
	return kvmtest.Sized[uint64](32, 16), kvmtest.Sized[uint64](24, 2), kvmtest.Sized[uint64](4, 1)
}

func (c *cluster) createDirty(name string) controlapi.InstanceView {
	c.t.Helper()
	mem, g, ws := dirtySize()
	var v controlapi.InstanceView
	c.mustCtl(&v, "instance", "create", name, "--guest", "dirty", "--memory", fmt.Sprintf("%dMiB", mem), "--volume", "4MiB",
		"--param", fmt.Sprintf("mem_mib=%d", g), "--param", fmt.Sprintf("working_set_mib=%d", ws), "--param", "verify_every_sec=1")
	return v
}

// waitVerifyPass waits for the dirty guest on vmm url to verify once
// more, which must pass.
func waitVerifyPass(t testing.TB, url, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), generous)
	defer cancel()
	c, err := client.New(url, nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.SerialHistory(ctx, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := c.Serial(ctx, h.NextOffset)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.CloseNow()
	var part string
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			t.Fatalf("waiting for a dirty verification %s: %v", what, err)
		}
		part += string(msg)
		for {
			i := strings.IndexByte(part, '\n')
			if i < 0 {
				break
			}
			line := strings.TrimRight(part[:i], "\r")
			part = part[i+1:]
			if v, ok := guests.ParseDirtyVerify(line); ok {
				if !v.Pass {
					t.Fatalf("dirty guest %s: %s", what, line)
				}
				return
			}
		}
	}
}

// waitRunning waits for instance name to run on one vmm, by the agents'
// reports, and returns the host and the vmm's URL.
func (c *cluster) waitRunning(name string) (string, string) {
	c.t.Helper()
	var v controlapi.InstanceView
	c.mustCtl(&v, "instance", "get", name)
	inv := c.waitAgents("instance "+name+" running", func(inv map[string]agentapi.Inventory) bool {
		return len(runningIn(inv, v.ID)) == 1
	})
	for h, s := range runningIn(inv, v.ID) {
		return h, s.URL
	}
	panic("unreachable")
}

// waitMigrationEnd follows migration id's record (a long-poll on its
// revision) until it is completed or failed.
func (c *cluster) waitMigrationEnd(id string) controlapi.Migration {
	c.t.Helper()
	deadline := time.Now().Add(generous)
	var m controlapi.Migration
	for m.State != controlapi.MigrationCompleted && m.State != controlapi.MigrationFailed {
		if time.Now().After(deadline) {
			c.t.Fatalf("migration %s never ended: %+v", id, m)
		}
		resp, err := http.Get(fmt.Sprintf("%s/v1/migrations/%s?after_rev=%d", c.control.URL, id, m.Rev))
		if err != nil {
			c.t.Fatal(err)
		}
		err = json.NewDecoder(resp.Body).Decode(&m)
		resp.Body.Close()
		if err != nil {
			c.t.Fatal(err)
		}
	}
	return m
}

// migrationsOf lists instance id's migrations.
func (c *cluster) migrationsOf(id string) []controlapi.Migration {
	c.t.Helper()
	var all, out []controlapi.Migration
	c.mustCtl(&all, "migration", "list")
	for _, m := range all {
		if m.InstanceID == id {
			out = append(out, m)
		}
	}
	return out
}

// settled waits until every vmm the agents have of instance id runs
// (the other side of its migration was destroyed), and checks the
// records agree with the agents: the instance is on the one vmm that
// runs, or failed on none when none does. It returns that vmm's host
// and URL ("" for none).
func (c *cluster) settled(id string) (string, string) {
	c.t.Helper()
	inv := c.waitAgents("instance "+id+"'s vmms all running or gone", func(inv map[string]agentapi.Inventory) bool {
		for _, v := range vmmsOf(inv, id) {
			if v.State != apiv1.Running {
				return false
			}
		}
		return true
	})
	running := runningIn(inv, id)
	var got controlapi.InstanceView
	c.mustCtl(&got, "instance", "get", id)
	switch len(running) {
	case 0:
		if got.State != "failed" || got.VMM != "" {
			c.t.Fatalf("no vmm of instance %s runs by the agents, but its record is %+v", id, got)
		}
		return "", ""
	case 1:
		for h, s := range running {
			if got.State != "running" || got.Host != h || got.VMM != s.ID {
				c.t.Fatalf("instance %s's record %+v disagrees with the agents (%s runs vmm %s)", id, got, h, s.ID)
			}
			return h, s.URL
		}
	}
	c.t.Fatalf("instance %s runs on %d vmms by the agents: %+v", id, len(running), running)
	return "", ""
}

// otherHost is a host of c that is not h.
func (c *cluster) otherHost(h string) string {
	for id := range c.hosts {
		if id != h {
			return id
		}
	}
	panic("one host")
}
