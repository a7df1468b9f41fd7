package migrationcontrol

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/tlsconf"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxguest"
	"tern/vmm/linuxtest"
)

// ternVMM is one `tern vmm serve`.
type ternVMM struct {
	cmd    *exec.Cmd
	url    string
	client *client.Client
	stderr *lockedBuffer
	exited chan struct{}
	err    error
}

// startTern starts `tern vmm serve` on a free loopback port with the
// certificates in certs.
func startTern(t *testing.T, certs string) *ternVMM {
	t.Helper()
	cmd := exec.Command(kvmtest.Tern(t), "vmm", "serve", "--listen", "127.0.0.1:0", "--certs", certs)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	p := &ternVMM{cmd: cmd, stderr: &lockedBuffer{}, exited: make(chan struct{})}
	cmd.Stderr = p.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		cmd.Process.Kill()
		t.Fatalf("tern vmm serve printed nothing: %v\n%s", cmd.Wait(), p.stderr)
	}
	first := lines.Text()
	go io.Copy(io.Discard, stdout)
	cmd.WaitDelay = 10 * time.Second // a child left holding stderr does not hold Wait
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	url, ok := strings.CutPrefix(first, "listening on ")
	if !ok {
		t.Fatalf("tern vmm serve's first line %q; want listening on URL", first)
	}
	p.url = url
	hc := http.DefaultClient
	if strings.HasPrefix(url, "https://") {
		b, err := tlsconf.Load(certs)
		if err != nil {
			t.Fatal(err)
		}
		hc = &http.Client{Transport: &http.Transport{TLSClientConfig: b.ClientConfig("127.0.0.1")}}
	}
	if p.client, err = client.New(url, hc); err != nil {
		t.Fatal(err)
	}
	return p
}

// stop ends the process: SIGTERM, then SIGKILL after a minute.
func (p *ternVMM) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(time.Minute):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

// state says what p's instance is: its state and error (a crash report
// when the VM crashed).
func (p *ternVMM) state(ctx context.Context) (apiv1.Instance, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return p.client.Get(ctx)
}

// untilFailed returns a context cancelled when p's instance fails (or
// ends), so that a wait on the console of a crashed guest ends at once.
func (p *ternVMM) untilFailed(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		p.client.WaitFor(ctx, 0, func(v apiv1.View) bool { return v.State.Terminal() })
	}()
	return ctx, cancel
}

// wsConsole is a console websocket as a linuxtest.LineSource and the
// keyboard.
type wsConsole struct {
	conn *websocket.Conn
	part string
}

func (w *wsConsole) Write(p []byte) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := w.conn.Write(ctx, websocket.MessageBinary, p); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (w *wsConsole) NextLine(ctx context.Context) (string, error) {
	for {
		if i := strings.IndexByte(w.part, '\n'); i >= 0 {
			line := strings.TrimRight(w.part[:i], "\r")
			w.part = w.part[i+1:]
			return line, nil
		}
		typ, msg, err := w.conn.Read(ctx)
		if err != nil {
			return "", err
		}
		if typ == websocket.MessageText {
			return "", fmt.Errorf("console message %q", msg)
		}
		w.part += string(msg)
	}
}

// shellOn opens p's console from its next byte (from its first when
// fromStart) and returns a Shell on it.
func shellOn(ctx context.Context, p *ternVMM, fromStart bool) (*linuxtest.Shell, *websocket.Conn, error) {
	var from uint64
	for !fromStart { // to the end of the history: the target's continues the source's
		h, err := p.client.SerialHistory(ctx, from, apiv1.MaxSerialMaxBytes)
		if err != nil {
			return nil, nil, err
		}
		if h.Data == "" || h.NextOffset == from {
			break
		}
		from = h.NextOffset
	}
	conn, err := p.client.Serial(ctx, from)
	if err != nil {
		return nil, nil, err
	}
	w := &wsConsole{conn: conn}
	return linuxtest.NewShell(w, w), conn, nil
}

// crashWhat names a tern instance error.
func crashWhat(e string) string {
	switch {
	case strings.Contains(e, "triple-fault"):
		return "triple fault"
	case e != "":
		return "instance failed"
	}
	return ""
}

// TestControlTern is the experiment: the guest under tern.
func TestControlTern(t *testing.T) {
	n := migrations(t)
	u := linuxtest.Userland(t)
	c := newTally("tern")
	defer c.report(t)
	dir := t.TempDir()
	certs := filepath.Join(dir, "certs")
	if err := tlsconf.Generate(certs, nil, false); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var (
		vmm  *ternVMM
		sh   *linuxtest.Shell
		conn *websocket.Conn
		spec apiv1.Spec
		pass int
		// bootFailures counts boots in a row that failed.
		bootFailures int
	)
	// lose records a guest failure, with whatever the VMMs say of their
	// instances (a crash report), and ends the guest.
	lose := func(attempt int, h string, p *guestProblem, vmms ...*ternVMM) {
		t.Helper()
		crashed := false
		for _, v := range vmms {
			inst, err := v.state(ctx)
			if err != nil {
				p.detail += fmt.Sprintf("\nGET /v1/instance of %s: %v", v.url, err)
				continue
			}
			p.detail += fmt.Sprintf("\n%s: instance %s, stop reason %q, error:\n%s", v.url, inst.State, inst.StopReason, inst.Error)
			// The first VMM's crash report names the failure (the
			// source's, before the target's "no live instance").
			if what := crashWhat(inst.Error); what != "" && !crashed {
				crashed = true
				p.what, p.signature = what+" ("+p.what+")", firstLine(inst.Error)
			}
		}
		if sh != nil {
			p.detail += "\nconsole's last lines:\n" + sh.Seen()
		}
		for _, v := range vmms {
			p.detail += fmt.Sprintf("\n%s stderr (last lines):\n%s", v.url, lastLines(v.stderr.String(), 40))
			v.stop()
		}
		c.fail(t, failure{attempt: attempt, hop: h, what: p.what, signature: p.signature, detail: p.detail})
		vmm, sh = nil, nil
		if conn != nil {
			conn.CloseNow()
		}
	}
	for c.attempted < n {
		if vmm == nil {
			if bootFailures == 3 {
				t.Fatalf("three boots in a row failed: the experiment cannot go on")
			}
			c.boots++
			disk := filepath.Join(dir, fmt.Sprintf("vda-%d.img", c.boots))
			if err := os.WriteFile(disk, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(disk, diskMiB<<20); err != nil {
				t.Fatal(err)
			}
			vmm = startTern(t, certs)
			spec = apiv1.Spec{ID: fmt.Sprintf("control-%d", c.boots), VCPUs: guestVCPUs, MemoryMiB: guestMemoryMiB,
				Guest: apiv1.GuestSpec{Kind: apiv1.GuestLinux, Kernel: u.Kernel, Initrd: u.Initrd, Cmdline: linuxguest.Cmdline},
				Disks: []apiv1.DiskSpec{{Name: "vda", Backend: apiv1.BackendSpec{Kind: apiv1.BackendFile, Path: disk}}},
				Init:  apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
			rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			if _, err := vmm.client.Ensure(rctx, spec); err != nil {
				t.Fatalf("ensuring the instance: %v", err)
			}
			if err := vmm.client.RequestState(rctx, apiv1.Run); err != nil {
				t.Fatalf("running the instance: %v", err)
			}
			var err error
			sh, conn, err = shellOn(rctx, vmm, true)
			cancel()
			if err != nil {
				t.Fatal(err)
			}
			boot := time.Now()
			var p *guestProblem
			gctx, stop := vmm.untilFailed(ctx)
			pass, p = bootAndStart(gctx, sh)
			stop()
			if p != nil {
				bootFailures++
				lose(0, "boot", p, vmm)
				continue
			}
			bootFailures = 0
			t.Logf("control: tern: guest %d ready and working in %.0f s", c.boots, time.Since(boot).Seconds())
		}
		attempt, h := c.attempted+1, hopOf(c.attempted)
		name := c.hopName(h)
		c.attempted++
		c.attemptedBy[name]++
		dst := startTern(t, certs)
		args := []string{"migrate", "--from", vmm.url, "--to", dst.url}
		if h == sameHost {
			args = append(args, "--same-host")
		}
		t.Logf("control: tern: migration %d (%s) starts at disk pass %d", attempt, name, pass)
		mctx, cancel := context.WithTimeout(ctx, migrationLimit)
		start := time.Now()
		migrate := exec.CommandContext(mctx, kvmtest.Tern(t), args...)
		migrate.WaitDelay = 10 * time.Second
		out, err := migrate.CombinedOutput()
		cancel()
		took := time.Since(start)
		if err != nil {
			// The guest is alive only if it still works on the source.
			src, serr := vmm.state(ctx)
			var p *guestProblem
			if serr == nil && src.State == apiv1.Running {
				gctx, stop := vmm.untilFailed(ctx)
				pass, p = checkGuest(gctx, sh, pass)
				stop()
				if p == nil {
					c.notCompletedAlive++
					t.Logf("control: tern: migration %d (%s) failed, the guest still works on the source: %v: %s", attempt, name, err, lastLines(string(out), 1))
					dst.stop()
					continue
				}
			}
			if p == nil {
				p = &guestProblem{what: "migration failed"}
			}
			p.signature = firstLine(lastLines(string(out), 1)) + "; " + p.signature
			p.detail += "\ntern migrate: " + lastLines(string(out), 20)
			lose(attempt, name, p, vmm, dst)
			continue
		}
		c.completed++
		c.completedBy[name]++
		conn.CloseNow()
		vmm.stop()
		vmm = dst
		rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		sh, conn, err = shellOn(rctx, vmm, false)
		cancel()
		if err != nil {
			lose(attempt, name, &guestProblem{what: "target console", signature: err.Error()}, vmm)
			continue
		}
		sh.Limit = shellLimit
		gctx, stop := vmm.untilFailed(ctx)
		now, p := checkGuest(gctx, sh, pass)
		stop()
		if p != nil {
			lose(attempt, name, p, vmm)
			continue
		}
		t.Logf("control: tern: migration %d (%s) completed in %.1f s (%s); the guest made disk passes %d to %d", attempt, name, took.Seconds(), lastLines(string(out), 1), pass, now)
		pass = now
	}
	if vmm != nil {
		conn.CloseNow()
		vmm.stop()
	}
}
