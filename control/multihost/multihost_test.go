package multihost

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"tern/agent"
	"tern/control"
	"tern/internal/tlsconf"
	"tern/vmm/client"
	"tern/vmm/guests"
	"tern/vmm/instance"
	"tern/vmm/kvm/kvmtest"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(memberEnv); spec != "" {
		os.Exit(runMember(spec))
	}
	kvmtest.Main(m, kvmtest.WithTern())
}

// generous bounds every wait; nothing asserts on time.
const generous = 3 * time.Minute

// proc is one tern process of a test.
type proc struct {
	name   string
	cmd    *exec.Cmd
	url    string
	stderr *bytes.Buffer
	exited chan error
	once   sync.Once
}

type lockedBuffer struct {
	mu sync.Mutex
	b  *bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// start runs tern args with env and waits for its "listening on URL".
func start(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	cmd := exec.Command(kvmtest.Tern(t), args...)
	cmd.Env = append(os.Environ(), env...)
	p := &proc{name: name, cmd: cmd, stderr: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stderr = &lockedBuffer{b: p.stderr}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() {
		cmd.Process.Kill()
		t.Fatalf("%s printed nothing: %v\n%s", name, cmd.Wait(), p.stderr)
	}
	go func() {
		io.Copy(io.Discard, stdout)
		p.exited <- cmd.Wait()
	}()
	url, ok := strings.CutPrefix(sc.Text(), "listening on ")
	if !ok {
		t.Fatalf("%s: first line %q", name, sc.Text())
	}
	p.url = url
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			t.Logf("%s stderr (tail):\n%s", name, tail(p.stderr.String(), 4000))
		}
	})
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// stop sends SIGTERM and waits (SIGKILL after a bound).
func (p *proc) stop() {
	p.once.Do(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(generous):
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
}

// cluster is a control plane and three agents.
type cluster struct {
	t       *testing.T
	dir     string
	certs   string
	control *proc
	agents  map[string]*proc
}

var hostIPs = map[string]string{"h2": "127.0.0.2", "h3": "127.0.0.3", "h4": "127.0.0.4"}

func newCluster(t *testing.T, controlEnv ...string) *cluster {
	t.Helper()
	kvmtest.Require(t)
	c := &cluster{t: t, dir: t.TempDir(), agents: map[string]*proc{}}
	c.certs = filepath.Join(c.dir, "certs")
	if err := tlsconf.Generate(c.certs, []string{"127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"}, false); err != nil {
		t.Fatal(err)
	}
	c.startControl(controlEnv...)
	for id, ip := range hostIPs {
		c.agents[id] = start(t, "agent "+id, nil, "agent", "--listen", ip+":0", "--data-dir", filepath.Join(c.dir, id),
			"--certs", c.certs, "--control", c.control.url, "--id", id, "--cpus", "8", "--memory", "2GiB")
	}
	// Registration is asynchronous: wait for every host's record.
	c.waitHosts(len(hostIPs))
	return c
}

// startControl (re)starts tern control on the cluster's data dir at a
// fixed port, so agents keep reaching it across restarts.
func (c *cluster) startControl(env ...string) {
	addr := "127.0.0.1:0"
	if c.control != nil {
		addr = strings.TrimPrefix(c.control.url, "http://")
	}
	c.control = start(c.t, "control", env, "control", "--listen", addr, "--data-dir", filepath.Join(c.dir, "control"), "--certs", c.certs)
}

// ctl runs tern ctl and decodes its --json output into out.
func (c *cluster) ctl(out any, args ...string) error {
	cmd := exec.Command(kvmtest.Tern(c.t), append([]string{"ctl", "--control", c.control.url, "--json"}, args...)...)
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

func (c *cluster) waitHosts(n int) {
	c.t.Helper()
	deadline := time.Now().Add(generous)
	for {
		var hosts []map[string]any
		if c.ctl(&hosts, "host", "list") == nil && len(hosts) == n {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the control plane has %d hosts, want %d", len(hosts), n)
		}
		// Agents register within a few retries of their backoff; ask
		// again once the next registration could have landed.
		<-time.After(50 * time.Millisecond)
	}
}

func (c *cluster) inventory(host string) agent.Inventory {
	c.t.Helper()
	inv, err := agent.NewClient(c.agents[host].url, nil).Inventory(context.Background())
	if err != nil {
		c.t.Fatal(err)
	}
	return inv
}

// runningVMMs returns, from the agents' own reports, every vmm of
// instance id that runs, by host.
func (c *cluster) runningVMMs(id string) map[string]agent.VMMStatus {
	out := map[string]agent.VMMStatus{}
	for h := range c.agents {
		for _, v := range c.inventory(h).VMMs {
			if v.InstanceID == id && !v.Gone && v.State == instance.Running {
				out[h] = v
			}
		}
	}
	return out
}

// dirtySize is the dirty guest's memory and working set here.
func dirtySize() (memMiB, guestMiB, workingMiB uint64) {
	return kvmtest.Sized[uint64](32, 16), kvmtest.Sized[uint64](24, 2), kvmtest.Sized[uint64](4, 1)
}

func (c *cluster) createDirty(name string) control.InstanceView {
	c.t.Helper()
	mem, g, ws := dirtySize()
	var v control.InstanceView
	c.mustCtl(&v, "instance", "create", name, "--guest", "dirty", "--memory", fmt.Sprintf("%dMiB", mem), "--volume", "4MiB",
		"--param", fmt.Sprintf("mem_mib=%d", g), "--param", fmt.Sprintf("working_set_mib=%d", ws), "--param", "verify_every_sec=1")
	return v
}

// waitVerifyPass waits for the dirty guest on vmm url to verify once
// more, which must pass.
func waitVerifyPass(t *testing.T, url, what string) {
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

// waitRunning waits for instance name to run on its vmm, from the
// agent's report, and returns the host and the vmm's URL.
func (c *cluster) waitRunning(name string) (string, string) {
	c.t.Helper()
	var v control.InstanceView
	c.mustCtl(&v, "instance", "get", name)
	deadline := time.Now().Add(generous)
	for {
		if vm := c.runningVMMs(v.ID); len(vm) == 1 {
			for h, s := range vm {
				return h, s.URL
			}
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("instance %s never ran", name)
		}
		<-time.After(50 * time.Millisecond)
	}
}

// TestDrainMovesEveryInstanceAndItsGuestKeepsVerifying creates four
// dirty guests on volumes across three hosts, drains one host, and checks
// every guest verifies on its new host, the drained host runs no vmm,
// and the records agree with the agents.
func TestDrainMovesEveryInstanceAndItsGuestKeepsVerifying(t *testing.T) {
	c := newCluster(t)
	names := []string{"d1", "d2", "d3", "d4"}
	for _, n := range names {
		c.createDirty(n)
	}
	where := map[string]string{}
	for _, n := range names {
		h, url := c.waitRunning(n)
		where[n] = h
		waitVerifyPass(t, url, n+" before the drain")
	}
	drained := where["d1"]
	var d map[string]any
	c.mustCtl(&d, "host", "drain", drained)
	if d["state"] != "done" {
		t.Fatalf("drain ended %v", d)
	}
	if inv := c.inventory(drained); len(inv.VMMs) != 0 {
		t.Fatalf("the drained host %s still runs vmms %+v", drained, inv.VMMs)
	}
	var hosts []control.HostView
	c.mustCtl(&hosts, "host", "list")
	for _, h := range hosts {
		if h.ID == drained && (h.State != control.HostDrained || h.VMMs != 0) {
			t.Fatalf("the drained host's record: %+v", h)
		}
	}
	var list []control.InstanceView
	c.mustCtl(&list, "instance", "list")
	for _, v := range list {
		running := c.runningVMMs(v.ID)
		if len(running) != 1 {
			t.Fatalf("instance %s runs %d vmms by the agents' reports: %+v", v.Name, len(running), running)
		}
		for h, s := range running {
			if v.State != "running" || v.Host != h || v.VMM != s.ID || h == drained {
				t.Fatalf("instance %s's record %+v disagrees with the agents (%s runs vmm %s) or is on the drained host", v.Name, v, h, s.ID)
			}
			waitVerifyPass(t, s.URL, v.Name+" after the drain")
		}
	}
}

// TestSIGKILLOfControlAtEachSagaStepEndsConsistent kills tern control
// right after each migration saga step acted (before it was recorded
// done), restarts it, and checks the migration ends completed or failed
// with the instance on exactly one running vmm, from the agents' reports.
func TestSIGKILLOfControlAtEachSagaStepEndsConsistent(t *testing.T) {
	for _, step := range control.StepNames() {
		t.Run(step, func(t *testing.T) {
			c := newCluster(t, "TERN_CONTROL_CRASH_AT=after:"+step)
			v := c.createDirty("k1")
			from, _ := c.waitRunning("k1")
			var to string
			for h := range hostIPs {
				if h != from {
					to = h
					break
				}
			}
			// The migrate call dies with the control process.
			c.ctl(nil, "instance", "migrate", "k1", "--to", to)
			select {
			case <-c.control.exited:
			case <-time.After(generous):
				t.Fatal("tern control did not die at the crash point")
			}
			c.control.once.Do(func() {})
			c.startControl()
			var migs []control.Migration
			c.mustCtl(&migs, "migration", "list")
			for _, m := range migs {
				var end control.Migration
				ctx, cancel := context.WithTimeout(context.Background(), generous)
				rev := int64(0)
				for end.State != control.MigrationCompleted && end.State != control.MigrationFailed {
					if ctx.Err() != nil {
						t.Fatalf("migration %s never ended: %+v", m.ID, end)
					}
					c.mustCtl(&end, "migration", "get", m.ID)
					if end.Rev == rev {
						<-time.After(50 * time.Millisecond)
					}
					rev = end.Rev
				}
				cancel()
			}
			host, url := c.waitRunning("k1")
			var got control.InstanceView
			deadline := time.Now().Add(generous)
			for {
				c.mustCtl(&got, "instance", "get", "k1")
				if got.State == "running" && got.Host == host || time.Now().After(deadline) {
					break
				}
				<-time.After(50 * time.Millisecond)
			}
			if got.State != "running" || got.Host != host {
				t.Fatalf("record %+v; the agents say it runs on %s", got, host)
			}
			if n := len(c.runningVMMs(v.ID)); n != 1 {
				t.Fatalf("%d running vmms", n)
			}
			waitVerifyPass(t, url, "after the crash at "+step)
		})
	}
}
