package quorum

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"tern/control/controlapi"

	"go.etcd.io/etcd/server/v3/embed"

	"tern/control/internal/proctest"
	"tern/internal/tlsconf"
)

// memberEnv makes the test binary run one etcd member (its JSON
// memberConfig) instead of the tests: a member is a process of its own,
// so the tests can SIGKILL it.
const memberEnv = "TERN_TEST_ETCD_MEMBER"

// memberConfig is one embedded etcd member of a three-member cluster.
type memberConfig struct {
	Name, Dir, ClientURL, PeerURL, Cluster string
}

// runMember runs the member of memberEnv until it is killed; it prints
// "started" once etcd runs (it may not have a quorum yet).
func runMember(spec string) int {
	var mc memberConfig
	if err := json.Unmarshal([]byte(spec), &mc); err != nil {
		fmt.Fprintln(os.Stderr, "member config:", err)
		return 2
	}
	cfg := embed.NewConfig()
	cfg.Name, cfg.Dir = mc.Name, mc.Dir
	cu, _ := url.Parse(mc.ClientURL)
	pu, _ := url.Parse(mc.PeerURL)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*cu}, []url.URL{*cu}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*pu}, []url.URL{*pu}
	cfg.InitialCluster, cfg.InitialClusterToken = mc.Cluster, "tern-multihost"
	cfg.LogLevel, cfg.LogOutputs = "error", []string{"stderr"}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting etcd:", err)
		return 1
	}
	fmt.Println("started")
	fmt.Fprintln(os.Stderr, "etcd:", <-e.Err())
	return 1
}

// member is one etcd member process of a test.
type member struct {
	cfg    memberConfig
	cmd    *exec.Cmd
	stderr *proctest.LockedBuffer
	exited chan struct{}
}

// freePort returns a port free on ip now.
func freePort(t *testing.T, ip string) int {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// startEtcdCluster starts three members on 127.0.0.2, .3 and .4.
func startEtcdCluster(t *testing.T, dir string) []*member {
	t.Helper()
	var ms []*member
	var cluster []string
	for i, ip := range []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"} {
		m := &member{cfg: memberConfig{Name: fmt.Sprintf("m%d", i+1), Dir: filepath.Join(dir, fmt.Sprintf("m%d", i+1)),
			ClientURL: fmt.Sprintf("http://%s:%d", ip, freePort(t, ip)), PeerURL: fmt.Sprintf("http://%s:%d", ip, freePort(t, ip))}}
		cluster = append(cluster, m.cfg.Name+"="+m.cfg.PeerURL)
		ms = append(ms, m)
	}
	for _, m := range ms {
		m.cfg.Cluster = strings.Join(cluster, ",")
		m.start(t)
	}
	return ms
}

// start runs the member (again, on its data dir) and waits for its
// "started".
func (m *member) start(t *testing.T) {
	t.Helper()
	spec, _ := json.Marshal(m.cfg)
	m.cmd = exec.Command(os.Args[0])
	m.cmd.Env = append(os.Environ(), memberEnv+"="+string(spec))
	m.stderr = &proctest.LockedBuffer{}
	m.cmd.Stderr = m.stderr
	stdout, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	m.exited = make(chan struct{})
	cmd, exited, stderr := m.cmd, m.exited, m.stderr
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("etcd %s stderr (tail):\n%s", m.cfg.Name, proctest.Tail(stderr.String(), 2000))
		}
	})
	sc := bufio.NewScanner(stdout)
	if !sc.Scan() || sc.Text() != "started" {
		t.Fatalf("etcd member %s did not start: %s", m.cfg.Name, proctest.Tail(m.stderr.String(), 2000))
	}
}

// kill SIGKILLs the member and waits for it to exit.
func (m *member) kill() {
	m.cmd.Process.Signal(syscall.SIGKILL)
	<-m.exited
}

// ctlAt runs tern ctl against the control process at url; it returns
// the --json output decoded into out, or the command's error with its
// stderr.
func ctlAt(t *testing.T, url string, out any, args ...string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), generous)
	defer cancel()
	cmd := exec.CommandContext(ctx, ternBin, append([]string{"ctl", "--control", url, "--json"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("tern ctl %v: %v: %s", args, err, strings.TrimSpace(stderr.String()))
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(stdout.Bytes(), out)
}

// leader asks the control process at url who leads, waiting (each ask
// a bounded long-poll) until wait holds: "leading", "known" or "" (no
// wait).
func leader(t *testing.T, url, wait string) controlapi.LeaderView {
	t.Helper()
	deadline := time.Now().Add(generous)
	for {
		var v controlapi.LeaderView
		resp, err := http.Get(url + "/v1/leader?wait=" + wait)
		if err == nil {
			err = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
		}
		if err == nil && (wait == "" || wait == "leading" && v.Leading || wait == "known" && v.LeaderURL != "") {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("control %s: no leader (%s) within %v: %+v %v", url, wait, generous, v, err)
		}
	}
}

// instanceNames lists the instances' names through url.
func instanceNames(t *testing.T, url string) []string {
	t.Helper()
	var list []controlapi.InstanceView
	if err := ctlAt(t, url, &list, "instance", "list"); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range list {
		names = append(names, v.Name)
	}
	return names
}

func createStopped(t *testing.T, url, name string) error {
	return ctlAt(t, url, nil, "instance", "create", name, "--guest", "dirty", "--volume", "0", "--no-start")
}

// TestControlPlaneOnThreeMemberEtcd runs two tern control processes on a
// three-member etcd: one leads and the other forwards to it; SIGKILL of
// the leader hands leadership over; with one member killed the control
// plane keeps working; with two killed writes are refused naming etcd's
// quorum; with the members back it works again, having lost nothing.
func TestControlPlaneOnThreeMemberEtcd(t *testing.T) {
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if err := tlsconf.Generate(certs, []string{"127.0.0.1"}, false); err != nil {
		t.Fatal(err)
	}
	ms := startEtcdCluster(t, dir)
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.cfg.ClientURL)
	}
	procs := map[string]*proctest.Proc{}
	for _, name := range []string{"a", "b"} {
		p := proctest.Start(t, ternBin, "", "control "+name, nil, "control", "--listen", "127.0.0.1:0", "--certs", certs,
			"--etcd-endpoints", strings.Join(eps, ","))
		procs[p.URL] = p
	}
	var any string
	for u := range procs {
		any = u
		break
	}
	lead := leader(t, any, "known").LeaderURL
	var follower string
	for u := range procs {
		if u != lead {
			follower = u
		}
	}
	if procs[lead] == nil || follower == "" {
		t.Fatalf("leader %s is not one of the two processes", lead)
	}
	if v := leader(t, follower, ""); v.Leading {
		t.Fatalf("both processes lead: %+v", v)
	}

	// The follower forwards writes to the leader.
	if err := createStopped(t, follower, "i1"); err != nil {
		t.Fatal(err)
	}
	if got := instanceNames(t, lead); strings.Join(got, ",") != "i1" {
		t.Fatalf("the leader lists %v, want [i1]", got)
	}

	// SIGKILL the leader: the follower takes over once its lease expires.
	procs[lead].Kill()
	leader(t, follower, "leading")
	if err := createStopped(t, follower, "i2"); err != nil {
		t.Fatal(err)
	}

	// One member down: a quorum of two remains.
	ms[0].kill()
	if err := createStopped(t, follower, "i3"); err != nil {
		t.Fatalf("with one etcd member killed: %v", err)
	}
	if got := instanceNames(t, follower); strings.Join(got, ",") != "i1,i2,i3" {
		t.Fatalf("with one etcd member killed the list is %v", got)
	}

	// Two down: no quorum. Writes are refused, saying why, not hung.
	ms[1].kill()
	err := createStopped(t, follower, "i4")
	if err == nil {
		t.Fatal("a create succeeded without an etcd quorum")
	}
	if msg := err.Error(); !strings.Contains(msg, "etcd") || !strings.Contains(msg, "quorum") {
		t.Fatalf("the refusal does not name etcd's quorum: %v", err)
	}
	t.Logf("without a quorum: %v", err)

	// The members return: the control plane leads and writes again.
	ms[0].start(t)
	ms[1].start(t)
	leader(t, follower, "leading")
	if err := createStopped(t, follower, "i4"); err != nil {
		t.Fatalf("after the members returned: %v", err)
	}
	if got := instanceNames(t, follower); strings.Join(got, ",") != "i1,i2,i3,i4" {
		t.Fatalf("after the members returned the list is %v", got)
	}
}
