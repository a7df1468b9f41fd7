package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"tern/control/controlapi"

	"github.com/coder/websocket"

	"tern/agent/agentapi"
	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/tlsconf"
	"tern/vmm/kvm"
)

// upMaxHosts bounds tern up --hosts: loopback addresses 127.0.0.2 on.
const upMaxHosts = 8

// Bounds of tern up --hosts: the agents get upAgentGrace to stop their
// vmms and downstairs, then the control plane upControlGrace.
const (
	upAgentGrace   = 8 * time.Second
	upControlGrace = 2 * time.Second
	// upCreateWait bounds the demo instance's creation and start.
	upCreateWait = 3 * time.Minute
)

// upCluster is what tern up --hosts started; stop undoes it.
type upCluster struct {
	control    *upChild
	controlURL string
	agents     []*upChild
}

func (u *upCluster) stop() {
	var wg sync.WaitGroup
	for _, a := range u.agents {
		wg.Go(func() { a.stop(upAgentGrace) })
	}
	wg.Wait()
	if u.control != nil {
		u.control.stop(upControlGrace)
	}
}

// runUpHosts is tern up --hosts n: tern control and n agents on loopback
// addresses 127.0.0.2 on, the demo instance created through the control
// plane on a volume across three of them, and its console streamed,
// following it across migrations.
func runUpHosts(ctx context.Context, dataDir string, n int, out io.Writer) error {
	if n < 3 || n > upMaxHosts {
		return fmt.Errorf("--hosts %d: want 3 to %d (a volume's three regions are on three hosts)", n, upMaxHosts)
	}
	if err := kvm.Probe(); err != nil {
		return fmt.Errorf("tern up --hosts needs a usable /dev/kvm: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the tern executable: %w", err)
	}
	if dataDir == "" {
		if dataDir, err = os.MkdirTemp("", "tern-up-"); err != nil {
			return fmt.Errorf("creating data directory: %w", err)
		}
		defer os.RemoveAll(dataDir)
	} else if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("creating data directory: %w", err)
	}
	fmt.Fprintf(out, "tern up: data, certificates and logs in %s\n", dataDir)
	certs := filepath.Join(dataDir, "certs")
	ips := append([]string(nil), tlsconf.DefaultHosts...)
	for i := range n {
		ips = append(ips, fmt.Sprintf("127.0.0.%d", i+2))
	}
	if err := tlsconf.Generate(certs, ips, false); err != nil && !errors.Is(err, tlsconf.ErrExists) {
		return fmt.Errorf("creating certificates: %w", err)
	}

	// The control plane and the agents run sibling binaries: find them,
	// or build them (which may take a minute the first time), before
	// their start is timed, and let the children exec those.
	for _, s := range []struct{ name, env string }{{"tern-control", controlBinaryEnv}, {"tern-agent", agentBinaryEnv}} {
		bin, err := siblingBinary(s.name, s.env, out)
		if err != nil {
			return err
		}
		os.Setenv(s.env, bin)
	}

	u := &upCluster{}
	defer u.stop()
	u.control, u.controlURL, err = startUpListener(self, "control", filepath.Join(dataDir, "control.log"), upStartWait, out,
		"control", "--listen", "127.0.0.1:0", "--data-dir", filepath.Join(dataDir, "control"), "--certs", certs)
	if err != nil {
		return err
	}
	var agentURLs []string
	for i := range n {
		id := fmt.Sprintf("h%d", i+2)
		c, url, err := startUpListener(self, "agent "+id, filepath.Join(dataDir, id+".log"), upStartWait, out,
			"agent", "--listen", fmt.Sprintf("127.0.0.%d:0", i+2), "--data-dir", filepath.Join(dataDir, id), "--certs", certs,
			"--control", u.controlURL, "--id", id, "--cpus", "4", "--memory", "1GiB")
		if err != nil {
			return err
		}
		u.agents = append(u.agents, c)
		agentURLs = append(agentURLs, url)
	}
	f := &ctlFlags{control: u.controlURL}
	wctx, cancel := context.WithTimeout(ctx, upCreateWait)
	defer cancel()
	for _, a := range agentURLs {
		if err := waitRegistered(wctx, a); err != nil {
			return err
		}
	}
	var demo controlapi.InstanceView
	req := controlapi.CreateInstance{Name: "demo", VCPUs: 1, MemoryMiB: 64, Guest: apiv1.GuestSpec{Kind: apiv1.GuestELF, Path: "demo"},
		VolumeBytes: 16 << 20, Start: true}
	if err := f.do(wctx, http.MethodPost, "/v1/instances", req, &demo); err != nil {
		return fmt.Errorf("creating the demo instance: %w", err)
	}
	printUpHostsIntro(out, self, u.controlURL, demo.Host, dataDir)
	consoleDone := make(chan struct{})
	go func() {
		defer close(consoleDone)
		followUpConsole(ctx, f, "demo", out)
	}()
	defer func() { <-consoleDone }()
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "\ntern up: stopping")
		return nil
	case <-u.control.exited:
		return fmt.Errorf("the control plane stopped: %v", u.control.proc.Err())
	}
}

// upConsoleRetry is the pause before asking the control plane again
// where the demo runs, when its console closed and the records do not
// yet name another vmm.
const upConsoleRetry = 200 * time.Millisecond

// followUpConsole copies instance name's console to out until ctx ends.
// When the console closes (its vmm was a migration's source, now
// destroyed) it asks the control plane which vmm runs the instance and
// reconnects there from the offset it had reached: a target's console
// history is its source's, continued.
func followUpConsole(ctx context.Context, f *ctlFlags, name string, out io.Writer) {
	var offset uint64
	var last string
	for ctx.Err() == nil {
		url, migration, err := upVMMURL(ctx, f, name)
		if err == nil && url == last && migration != "" {
			// Still on the source: wait for the migration's end.
			ctlWaitMigration(ctx, f, migration)
			continue
		}
		if err != nil || url == last {
			select {
			case <-time.After(upConsoleRetry):
			case <-ctx.Done():
			}
			continue
		}
		last = url
		offset = copyUpConsole(ctx, url, offset, out)
	}
}

// copyUpConsole copies the console of the vmm at url from offset to out
// until it closes or ctx ends, and returns the offset reached.
func copyUpConsole(ctx context.Context, url string, offset uint64, out io.Writer) uint64 {
	c, err := client.New(url, nil)
	if err != nil {
		return offset
	}
	conn, err := c.Serial(ctx, offset)
	if err != nil {
		return offset
	}
	defer conn.CloseNow()
	for {
		typ, msg, err := conn.Read(ctx)
		if err != nil {
			return offset
		}
		if typ == websocket.MessageBinary {
			offset += uint64(len(msg))
			out.Write(msg)
		}
	}
}

// waitRegistered follows the agent at url's inventory (its long-poll)
// until the control plane took its registration.
func waitRegistered(ctx context.Context, url string) error {
	a := agentapi.NewClient(url, nil)
	var gen agentapi.InventoryGen
	for {
		inv, err := a.InventoryAfter(ctx, gen)
		if err != nil {
			return fmt.Errorf("waiting for the agent at %s to register: %w", url, err)
		}
		if inv.Registered {
			return nil
		}
		gen = inv.Gen
	}
}

// upVMMURL returns the URL of the vmm that runs instance name, from its
// host's agent, and the migration it is in ("" for none).
func upVMMURL(ctx context.Context, f *ctlFlags, name string) (string, string, error) {
	var v controlapi.InstanceView
	if err := f.do(ctx, http.MethodGet, "/v1/instances/"+url.PathEscape(name), nil, &v); err != nil {
		return "", "", err
	}
	if v.VMM == "" {
		return "", "", fmt.Errorf("instance %s runs no vmm", name)
	}
	var h controlapi.HostView
	if err := f.do(ctx, http.MethodGet, "/v1/hosts/"+url.PathEscape(v.Host), nil, &h); err != nil {
		return "", "", err
	}
	st, err := agentapi.NewClient(h.Address, nil).VMM(ctx, v.VMM)
	if err != nil {
		return "", "", fmt.Errorf("finding instance %s's vmm %s on host %s: %w", name, v.VMM, v.Host, err)
	}
	return st.URL, v.MigrationID, nil
}

// printUpHostsIntro prints the control plane's URL (the first URL tern
// up --hosts prints) and tern ctl commands to try, a drain of the demo's
// host among them.
func printUpHostsIntro(out io.Writer, self, url, demoHost, dataDir string) {
	tern := self
	if strings.Contains(self, "go-build") { // `go run ./cmd/tern up`
		tern = "go run ./cmd/tern"
	}
	fmt.Fprintf(out, "Control: %s\n", url)
	fmt.Fprintf(out, `
Try, in another terminal:
  %[1]s ctl --control %[2]s host list
  %[1]s ctl --control %[2]s instance list
  %[1]s ctl --control %[2]s host drain %[3]s    (the demo's host: it moves live, its console below keeps printing)
  %[1]s ctl --control %[2]s instance migrate demo
  %[1]s ctl --control %[2]s migration list
Logs: %[4]s/*.log. Ctrl-C (SIGINT) or SIGTERM stops everything.

`, tern, url, demoHost, dataDir)
}
