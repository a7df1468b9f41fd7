package vmmruntest

import (
	"bufio"
	"bytes"
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

	"tern/tools/guests"
	"tern/vmm/kvm/kvmtest"
	"tern/volume/extent"
)

// downstairs is one `tern downstairs run` process.
type downstairs struct {
	cmd    *exec.Cmd
	addr   string
	exited chan error
}

// startDownstairs runs tern downstairs on dir and waits for its
// "listening" log record; the cleanup stops it with SIGTERM.
func startDownstairs(t *testing.T, dir, certs string) *downstairs {
	t.Helper()
	cmd := exec.Command(kvmtest.Tern(t), "downstairs", "run", "--dir", dir, "--listen", "127.0.0.1:0", "--certs", certs)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	d := &downstairs{cmd: cmd, exited: make(chan error, 1)}
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
		d.exited <- cmd.Wait()
	}()
	select {
	case d.addr = <-listening:
	case err := <-d.exited:
		t.Fatalf("downstairs on %s exited before listening: %v", dir, err)
	case <-time.After(generous):
		cmd.Process.Kill()
		t.Fatalf("downstairs on %s never logged listening", dir)
	}
	t.Cleanup(func() { d.stop() })
	return d
}

// stop ends the process with SIGTERM (SIGKILL after a minute) and waits.
func (d *downstairs) stop() {
	if d.cmd == nil {
		return
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(time.Minute):
		d.cmd.Process.Kill()
		<-d.exited
	}
	d.cmd = nil
}

// TestVMMRunDiskGuestOnAThreeReplicaVolume runs the disk guest on a volume
// served by three downstairs processes, then reads each replica's region
// from its files: all three hold the guest's pattern.
func TestVMMRunDiskGuestOnAThreeReplicaVolume(t *testing.T) {
	kvmtest.Require(t)
	base := t.TempDir()
	certs := filepath.Join(base, "certs")
	if _, stderr, code := run(t, "", "certs", "init", "--dir", certs); code != 0 {
		t.Fatalf("certs init: %s", stderr)
	}
	id := uuid.NewString()
	var dirs [3]string
	var procs [3]*downstairs
	var addrs []string
	for i := range dirs {
		dirs[i] = filepath.Join(base, "r"+strconv.Itoa(i))
		if _, stderr, code := run(t, "", "downstairs", "create", "--dir", dirs[i], "--uuid", id,
			"--block-size", "512", "--extent-size", "1MiB", "--extent-count", "4"); code != 0 {
			t.Fatalf("downstairs create: %s", stderr)
		}
		procs[i] = startDownstairs(t, dirs[i], certs)
		addrs = append(addrs, procs[i].addr)
	}
	stdout, stderr, code := run(t, "", "vmm", "run", "--guest", "disk",
		"--disk", "volume:"+strings.Join(addrs, ","), "--certs", certs, "--gen", "1")
	if code != 0 || !strings.Contains(stdout, "disk: PASS 256 sectors") {
		t.Fatalf("exit status %d; stdout %q; stderr %q", code, stdout, stderr)
	}
	for i, p := range procs {
		p.stop()
		region, err := extent.Open(dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 256*512)
		err = region.ReadBlocks(0, got, make([]uint64, 256))
		region.Close()
		if err != nil {
			t.Fatalf("reading replica %d: %v", i, err)
		}
		for s := uint64(0); s < 256; s++ {
			if !bytes.Equal(got[s*512:(s+1)*512], guests.DiskPattern(guests.DefaultDiskSeed, s)) {
				t.Fatalf("replica %d: sector %d does not hold the disk guest's pattern", i, s)
			}
		}
	}
}
