package client_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"tern/instance/api"
	"tern/instance/client"
	"tern/internal/tlsconf"
	"tern/vmm/kvm/kvmtest"
	"tern/vmm/linuxtest"
)

// TestMain: in the emulated host, the Linux tests (two vCPUs) and the
// live-repair test (a busy guest beside the repair) get two emulated CPUs
// of their own; the rest, migrations among them, run on one.
func TestMain(m *testing.M) {
	kvmtest.Main(m, kvmtest.WithTern(), kvmtest.WithPrepare(linuxtest.Prepare), kvmtest.WithPrepare(linuxtest.PrepareUserland), kvmtest.WithEmulatedCPUsFor(2, "Linux|LiveRepair"))
}

// generous bounds every wait; nothing asserts on time.
const generous = 2 * time.Minute

// vmmProc is a running `tern vmm serve`.
type vmmProc struct {
	cmd    *exec.Cmd
	url    string
	certs  string
	stderr *bytes.Buffer
	client *client.Client
	// raw sends requests the client would not build; both validate
	// against openapi.json.
	raw *http.Client
	// exited delivers Wait's result once.
	exited   chan error
	termOnce sync.Once
	termErr  error
}

// terminate sends SIGTERM and returns how the process exited (nil: 0).
func (p *vmmProc) terminate(t *testing.T) error {
	p.termOnce.Do(func() {
		p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case p.termErr = <-p.exited:
		case <-time.After(generous):
			p.cmd.Process.Kill()
			p.termErr = fmt.Errorf("tern vmm serve did not exit after SIGTERM: %w", <-p.exited)
		}
	})
	return p.termErr
}

// quit sends SIGQUIT, which makes the Go runtime print every goroutine's
// stack and exit, and returns the process's stderr once it exited (or
// after a generous wait).
func (p *vmmProc) quit() string {
	p.termOnce.Do(func() {
		p.cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case p.termErr = <-p.exited:
		case <-time.After(generous):
			p.cmd.Process.Kill()
			p.termErr = <-p.exited
		}
	})
	return p.stderr.String()
}

// startVMM runs `tern vmm serve` on a free loopback port with fresh
// certificates (or certs, when given) and stops it with SIGTERM at the end
// of the test, which must make it exit 0.
func startVMM(t *testing.T, certs string, extraArgs ...string) *vmmProc {
	t.Helper()
	return startVMMEnv(t, certs, nil, extraArgs...)
}

// startVMMEnv is startVMM with env added to the process's environment.
func startVMMEnv(t *testing.T, certs string, env []string, extraArgs ...string) *vmmProc {
	t.Helper()
	kvmtest.Require(t)
	if certs == "" {
		certs = filepath.Join(t.TempDir(), "certs")
		if err := tlsconf.Generate(certs, nil, false); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(kvmtest.Tern(t), append([]string{"vmm", "serve", "--listen", "127.0.0.1:0", "--certs", certs}, extraArgs...)...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	p := &vmmProc{cmd: cmd, certs: certs, stderr: &bytes.Buffer{}, exited: make(chan error, 1)}
	cmd.Stderr = &lockedWriter{w: p.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	if !lines.Scan() {
		cmd.Process.Kill()
		t.Fatalf("tern vmm serve printed nothing: %v\n%s", cmd.Wait(), p.stderr)
	}
	first := lines.Text()
	go func() {
		io.Copy(io.Discard, stdout)
		p.exited <- cmd.Wait()
	}()
	url, ok := strings.CutPrefix(first, "listening on ")
	if !ok {
		t.Fatalf("first line %q; want listening on URL", first)
	}
	p.url = url
	base := http.DefaultTransport
	if strings.HasPrefix(url, "https://") {
		b, err := tlsconf.Load(certs)
		if err != nil {
			t.Fatal(err)
		}
		base = &http.Transport{TLSClientConfig: b.ClientConfig("127.0.0.1")}
	}
	p.raw = &http.Client{Transport: newValidatingTransport(t, base)}
	if p.client, err = client.New(url, p.raw); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			// Where every goroutine stood when the test failed (a vCPU in
			// KVM_RUN, or blocked in an exit handler, or a queue worker
			// waiting on the volume) says more of a stalled guest than
			// anything the guest can still print.
			t.Logf("tern vmm serve stderr, with its goroutines at SIGQUIT:\n%s", p.quit())
			return
		}
		if err := p.terminate(t); err != nil {
			t.Errorf("tern vmm serve after SIGTERM: %v", err)
		}
		if t.Failed() {
			t.Logf("tern vmm serve stderr:\n%s", p.stderr)
		} else if n := strings.Count(p.stderr.String(), "interrupt unacknowledged"); n > 0 {
			t.Logf("tern vmm serve raised an unacknowledged interrupt again %d times", n)
		}
	})
	return p
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(t.Context(), generous)
	t.Cleanup(cancel)
	return c
}

// validatingTransport checks every request and response against
// openapi.json (websocket upgrades and /metrics excepted).
type validatingTransport struct {
	t      *testing.T
	base   http.RoundTripper
	router routers.Router
}

func newValidatingTransport(t *testing.T, base http.RoundTripper) *validatingTransport {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI())
	if err != nil {
		t.Fatalf("loading openapi.json: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.json is not valid OpenAPI 3: %v", err)
	}
	doc.Servers = nil
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &validatingTransport{t: t, base: base, router: router}
}

func (v *validatingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Header.Get("Upgrade") != "" || req.URL.Path == "/metrics" {
		return v.base.RoundTrip(req)
	}
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	resp, err := v.base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	rb, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(rb))
	vreq := req.Clone(context.Background())
	vreq.Body = io.NopCloser(bytes.NewReader(body))
	route, params, err := v.router.FindRoute(vreq)
	if err != nil {
		if resp.StatusCode != http.StatusMethodNotAllowed && resp.StatusCode != http.StatusNotFound {
			v.t.Errorf("openapi: %s %s: no route in the document: %v", req.Method, req.URL.Path, err)
		}
		return resp, nil
	}
	in := &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	// A request the test sends on purpose to be refused is valid only
	// if the server refused it.
	reqErr := openapi3filter.ValidateRequest(context.Background(), in)
	if reqErr != nil && resp.StatusCode/100 == 2 {
		v.t.Errorf("openapi: %s %s: the server accepted (%d) a request the document forbids: %v", req.Method, req.URL, resp.StatusCode, reqErr)
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode,
		Header: resp.Header, Body: io.NopCloser(bytes.NewReader(rb)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		v.t.Errorf("openapi: %s %s -> %d does not match the document: %v\n%s", req.Method, req.URL, resp.StatusCode, err, rb)
	}
	return resp, nil
}

// fdsOf lists the process's open files by what they point at.
func fdsOf(t *testing.T, pid int) []string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			out = append(out, l)
		}
	}
	return out
}
