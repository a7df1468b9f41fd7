package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/child"
)

// vmmStartWait bounds a `tern vmm serve` start and vmmStopWait its exit
// after SIGTERM.
const (
	vmmStartWait = time.Minute
	vmmStopWait  = time.Minute
)

// vmmProc is one `tern vmm serve` process of the start benchmark.
type vmmProc struct {
	proc   *child.Process
	url    string
	client *client.Client
	// http keeps its connections alive: ensure and healthz are timed on
	// warm connections alike.
	http *http.Client
}

// startVMMProc starts `tern vmm serve` with the certificates in certs,
// logging to logPath, and returns once it printed its URL.
func startVMMProc(tern, certs, logPath string) (*vmmProc, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("starting vmm: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(tern, "vmm", "serve", "--listen", "127.0.0.1:0", "--certs", certs)
	cmd.Stderr = logFile
	proc, url, err := child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningURL, Wait: vmmStartWait, What: "its URL"}})
	if err != nil {
		return nil, fmt.Errorf("%w; see %s", err, logPath)
	}
	p := &vmmProc{proc: proc, url: url}
	p.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	if p.client, err = client.New(p.url, p.http); err != nil {
		p.stop()
		return nil, err
	}
	return p, nil
}

// stop ends the process with SIGTERM (SIGKILL after vmmStopWait).
func (p *vmmProc) stop() error {
	if err := p.proc.Stop(vmmStopWait); err != nil {
		return fmt.Errorf("stopping vmm: %w", err)
	}
	return nil
}

// healthz times one GET /healthz.
func (p *vmmProc) healthz(ctx context.Context) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url+"/healthz", nil)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	resp, err := p.http.Do(req)
	if err != nil {
		return 0, fmt.Errorf("getting /healthz: %w", err)
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	elapsed := time.Since(start)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("getting /healthz: %s", resp.Status)
	}
	return elapsed, err
}

// stopInstance asks the instance to stop and waits until it is gone.
func (p *vmmProc) stopInstance(ctx context.Context, afterGen apiv1.ViewGen) error {
	if err := p.client.RequestState(ctx, apiv1.Stop); err != nil && !client.IsCode(err, "instance_gone") {
		return fmt.Errorf("stopping instance: %w", err)
	}
	_, err := p.client.WaitFor(ctx, afterGen, func(s apiv1.View) bool {
		return s.State == apiv1.Destroyed || s.State == apiv1.Failed
	})
	if client.IsCode(err, "instance_gone") {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("waiting for the instance to be gone: %w", err)
	}
	return nil
}

// fileDisk creates a zeroed raw disk file of sizeBytes in dir.
func fileDisk(dir string, sizeBytes int64) (string, error) {
	path := filepath.Join(dir, "disk.raw")
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("creating disk file: %w", err)
	}
	if err := f.Truncate(sizeBytes); err != nil {
		f.Close()
		return "", fmt.Errorf("creating disk file: %w", err)
	}
	return path, errors.Join(f.Close())
}
