package main

import (
	"bufio"
	"encoding/json"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
)

// volumeProcs is three `tern downstairs run` processes serving one volume,
// set up the way the README tells a newcomer to.
type volumeProcs struct {
	certs   string
	dirs    [3]string
	addrs   [3]string
	running [3]*downstairsProc
}

type downstairsProc struct {
	cmd    *exec.Cmd
	exited chan error
}

// startVolumeProcesses creates certificates and three 4-extent regions of
// one uuid and starts a downstairs process on each.
func startVolumeProcesses(t *testing.T) *volumeProcs {
	t.Helper()
	base := t.TempDir()
	v := &volumeProcs{certs: filepath.Join(base, "certs")}
	if _, stderr, code := runTern(t, "certs", "init", "--dir", v.certs); code != 0 {
		t.Fatalf("certs init: %s", stderr)
	}
	id := uuid.NewString()
	for i := range v.dirs {
		v.dirs[i] = filepath.Join(base, "r"+strconv.Itoa(i))
		if _, stderr, code := runTern(t, "downstairs", "create", "--dir", v.dirs[i], "--uuid", id,
			"--block-size", "4096", "--extent-size", "1MiB", "--extent-count", "4"); code != 0 {
			t.Fatalf("downstairs create: %s", stderr)
		}
		v.start(t, i)
	}
	t.Cleanup(func() {
		for i := range v.running {
			v.stop(t, i)
		}
	})
	return v
}

// start runs replica i, on its previous address if it had one, and waits
// for its "listening" log line.
func (v *volumeProcs) start(t *testing.T, i int) {
	t.Helper()
	listen := v.addrs[i]
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	cmd := exec.Command(ternBin, "downstairs", "run", "--dir", v.dirs[i], "--listen", listen, "--certs", v.certs)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &downstairsProc{cmd: cmd, exited: make(chan error, 1)}
	listening := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == "listening" {
				addr, _ := rec["addr"].(string)
				listening <- addr
			}
		}
		io.Copy(io.Discard, stderr)
		p.exited <- cmd.Wait()
	}()
	select {
	case addr := <-listening:
		v.addrs[i] = addr
		v.running[i] = p
	case err := <-p.exited:
		t.Fatalf("downstairs %d exited before listening: %v", i, err)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("downstairs %d never logged listening", i)
	}
}

// stop ends replica i with SIGTERM (SIGKILL after 10 s).
func (v *volumeProcs) stop(t *testing.T, i int) {
	t.Helper()
	p := v.running[i]
	if p == nil {
		return
	}
	v.running[i] = nil
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

func (v *volumeProcs) targetList() string { return strings.Join(v.addrs[:], ",") }
