package main

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"tern/internal/child"
)

// volumeProcs is `tern downstairs run` processes serving one volume (three
// replicas, or the shards of an erasure-coded one), set up the way the
// README tells a newcomer to.
type volumeProcs struct {
	certs   string
	dirs    []string
	addrs   []string
	running []*downstairsProc
}

type downstairsProc struct {
	proc *child.Process
	// records receives every JSON log record the process writes (a full
	// channel drops them).
	records chan map[string]any
}

// recordSink parses each log line it is written into a record on a
// channel, dropping records when the channel is full.
type recordSink chan map[string]any

func (s recordSink) Write(line []byte) (int, error) {
	var rec map[string]any
	if json.Unmarshal(line, &rec) == nil {
		select {
		case s <- rec:
		default:
		}
	}
	return len(line), nil
}

// startVolumeProcesses creates certificates and three 4-extent regions of
// one uuid (1 MiB extents) and starts a downstairs process on each.
func startVolumeProcesses(t *testing.T) *volumeProcs {
	t.Helper()
	return startVolumeProcessesSized(t, "1MiB")
}

// startVolumeProcessesSized is startVolumeProcesses with extents of
// extentSize (a --extent-size value).
func startVolumeProcessesSized(t *testing.T, extentSize string) *volumeProcs {
	t.Helper()
	return startVolumeProcessesN(t, extentSize, 3)
}

// startVolumeProcessesN starts n downstairs processes of 4-extent regions
// of one uuid with extents of extentSize.
func startVolumeProcessesN(t *testing.T, extentSize string, n int) *volumeProcs {
	t.Helper()
	base := t.TempDir()
	v := &volumeProcs{certs: filepath.Join(base, "certs"), dirs: make([]string, n), addrs: make([]string, n), running: make([]*downstairsProc, n)}
	if _, stderr, code := runTern(t, "certs", "init", "--dir", v.certs); code != 0 {
		t.Fatalf("certs init: %s", stderr)
	}
	id := uuid.NewString()
	for i := range v.dirs {
		v.dirs[i] = filepath.Join(base, "r"+strconv.Itoa(i))
		if _, stderr, code := runTern(t, "downstairs", "create", "--dir", v.dirs[i], "--uuid", id,
			"--block-size", "4096", "--extent-size", extentSize, "--extent-count", "4"); code != 0 {
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
	records := make(chan map[string]any, 4096)
	proc, addr, err := child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningAddr, Stderr: true,
		Log: recordSink(records), Wait: 30 * time.Second, What: "its listening record"}})
	if err != nil {
		t.Fatalf("downstairs %d: %v", i, err)
	}
	v.addrs[i] = addr
	v.running[i] = &downstairsProc{proc: proc, records: records}
}

// stop ends replica i with SIGTERM (SIGKILL after 10 s).
func (v *volumeProcs) stop(t *testing.T, i int) {
	t.Helper()
	p := v.running[i]
	if p == nil {
		return
	}
	v.running[i] = nil
	p.proc.Stop(10 * time.Second)
}

// kill ends replica i with SIGKILL, the way a crash does, and waits for
// it to exit.
func (v *volumeProcs) kill(t *testing.T, i int) {
	t.Helper()
	p := v.running[i]
	if p == nil {
		return
	}
	v.running[i] = nil
	p.proc.Kill()
}

// waitRecord returns the first log record of running replica i for which
// match holds, failing the test after a minute without one.
func (v *volumeProcs) waitRecord(t *testing.T, i int, match func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case rec := <-v.running[i].records:
			if match(rec) {
				return rec
			}
		case <-deadline:
			t.Fatalf("downstairs %d logged no matching record within a minute", i)
		}
	}
}

func (v *volumeProcs) targetList() string { return strings.Join(v.addrs[:], ",") }
