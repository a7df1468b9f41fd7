package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// nbdWait bounds every wait of the NBD tests: generous, for a busy
// two-core machine under -race.
const nbdWait = 2 * time.Minute

// needTools skips the test when a client it drives is not installed,
// except in CI (.ci/run installs them), where that is a failure.
func needTools(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			if os.Getenv("CI") != "" {
				t.Fatalf("%s is not installed (.ci/run installs it): %v", n, err)
			}
			t.Skipf("%s is not installed (Debian: qemu-utils, libnbd-bin, fio, nbdkit, fuse3): %v", n, err)
		}
	}
}

// runTool runs a client to completion and returns its stdout, failing the
// test with its output when it fails.
func runTool(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, errOut, err := tryTool(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\nstdout: %s\nstderr: %s", name, strings.Join(args, " "), err, out, errOut)
	}
	return out
}

func tryTool(name string, args ...string) (string, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), nbdWait)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// nbdProc is a running `tern volume nbd`.
type nbdProc struct {
	cmd    *exec.Cmd
	uri    string
	sock   string // the unix socket, when it listens on one
	exited chan error
	// lines receives each stderr line (a full channel drops them);
	// stderr keeps them all.
	lines  chan string
	mu     sync.Mutex
	stderr strings.Builder
}

// startNBD runs `tern volume nbd` over v's replicas with gen, on a unix
// socket unless extra names a --listen, and waits for its "serving" line.
func startNBD(t *testing.T, v *volumeProcs, gen int, extra ...string) *nbdProc {
	t.Helper()
	p := &nbdProc{exited: make(chan error, 1), lines: make(chan string, 1024)}
	args := []string{"volume", "nbd", "--targets", v.targetList(), "--certs", v.certs, "--gen", strconv.Itoa(gen)}
	if !strings.Contains(strings.Join(extra, " "), "--listen") {
		// Socket paths are short (108 bytes): not under t.TempDir.
		dir, err := os.MkdirTemp("", "tern-nbd")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		p.sock = filepath.Join(dir, "s")
		args = append(args, "--listen", "unix:"+p.sock)
	}
	p.cmd = exec.Command(ternBin, append(args, extra...)...)
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan string, 1)
	var readers sync.WaitGroup
	readers.Go(func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if uri, ok := strings.CutPrefix(sc.Text(), "serving "); ok {
				serving <- strings.Fields(uri)[0]
			}
		}
		io.Copy(io.Discard, stdout)
	})
	readers.Go(func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
			select {
			case p.lines <- sc.Text():
			default:
			}
		}
		io.Copy(io.Discard, stderr)
	})
	go func() {
		readers.Wait()
		p.exited <- p.cmd.Wait()
	}()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			<-p.exited
		}
	})
	select {
	case p.uri = <-serving:
	case err := <-p.exited:
		t.Fatalf("tern volume nbd exited before serving: %v\n%s", err, p.log())
	case <-time.After(nbdWait):
		t.Fatalf("tern volume nbd did not serve within %v\n%s", nbdWait, p.log())
	}
	return p
}

func (p *nbdProc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// stop sends SIGTERM and checks the process exits 0 within 10 s, having
// flushed and deactivated.
func (p *nbdProc) stop(t *testing.T) {
	t.Helper()
	start := time.Now()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("tern volume nbd after SIGTERM: %v\n%s", err, p.log())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("tern volume nbd still running 10 s after SIGTERM\n%s", p.log())
	}
	if !strings.Contains(p.log(), "flushed and deactivated") {
		t.Fatalf("tern volume nbd did not say it flushed and deactivated\n%s", p.log())
	}
	t.Logf("tern volume nbd stopped in %v", time.Since(start).Round(time.Millisecond))
}

// waitLine returns the first stderr line containing s.
func (p *nbdProc) waitLine(t *testing.T, s string) string {
	t.Helper()
	deadline := time.After(nbdWait)
	for {
		select {
		case l := <-p.lines:
			if strings.Contains(l, s) {
				return l
			}
		case <-deadline:
			t.Fatalf("tern volume nbd logged no line with %q within %v\n%s", s, nbdWait, p.log())
		}
	}
}

// NBD wire values the raw test client needs (the protocol's, not tern's).
const (
	nbdOptMagic    = 0x49484156454f5054
	nbdOptGo       = 7
	nbdRepAck      = 1
	nbdRepErrUnkn  = 1<<31 + 6
	nbdReqMagic    = 0x25609513
	nbdCmdRead     = 0
	nbdCmdWrite    = 1
	nbdCmdFlush    = 3
	nbdErrNoSpace  = 28
	nbdSimpleMagic = 0x67446698
)

// rawNBD is a hand-driven NBD connection, for what no well-behaved client
// sends.
type rawNBD struct {
	t *testing.T
	c net.Conn
}

// dialRawNBD connects to the unix socket and completes the greeting.
func dialRawNBD(t *testing.T, sock string) *rawNBD {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(nbdWait))
	r := &rawNBD{t: t, c: c}
	r.read(18)                                     // NBDMAGIC, IHAVEOPT, handshake flags
	r.write(binary.BigEndian.AppendUint32(nil, 3)) // fixed newstyle, no zeroes
	return r
}

func (r *rawNBD) read(n int) []byte {
	r.t.Helper()
	b := make([]byte, n)
	if _, err := io.ReadFull(r.c, b); err != nil {
		r.t.Fatalf("reading from the NBD server: %v", err)
	}
	return b
}

func (r *rawNBD) write(b []byte) {
	r.t.Helper()
	if _, err := r.c.Write(b); err != nil {
		r.t.Fatalf("writing to the NBD server: %v", err)
	}
}

// optGo sends NBD_OPT_GO for name and returns the final reply type (ACK
// or an error).
func (r *rawNBD) optGo(name string) uint32 {
	r.t.Helper()
	data := binary.BigEndian.AppendUint32(nil, uint32(len(name)))
	data = append(data, name...)
	data = binary.BigEndian.AppendUint16(data, 0)
	b := binary.BigEndian.AppendUint64(nil, nbdOptMagic)
	b = binary.BigEndian.AppendUint32(b, nbdOptGo)
	b = binary.BigEndian.AppendUint32(b, uint32(len(data)))
	r.write(append(b, data...))
	for {
		h := r.read(20)
		typ := binary.BigEndian.Uint32(h[12:])
		r.read(int(binary.BigEndian.Uint32(h[16:])))
		if typ == nbdRepAck || typ&(1<<31) != 0 {
			return typ
		}
	}
}

// request sends one request header and payload.
func (r *rawNBD) request(cmd uint16, cookie, off uint64, length uint32, payload []byte) {
	r.t.Helper()
	b := binary.BigEndian.AppendUint32(nil, nbdReqMagic)
	b = binary.BigEndian.AppendUint16(b, 0)
	b = binary.BigEndian.AppendUint16(b, cmd)
	b = binary.BigEndian.AppendUint64(b, cookie)
	b = binary.BigEndian.AppendUint64(b, off)
	b = binary.BigEndian.AppendUint32(b, length)
	r.write(append(b, payload...))
}

// reply reads a simple reply, and dataLen bytes of data if it succeeded.
func (r *rawNBD) reply(dataLen int) (cookie uint64, errno uint32, data []byte) {
	r.t.Helper()
	h := r.read(16)
	if m := binary.BigEndian.Uint32(h); m != nbdSimpleMagic {
		r.t.Fatalf("reply magic %#x", m)
	}
	errno, cookie = binary.BigEndian.Uint32(h[4:]), binary.BigEndian.Uint64(h[8:])
	if errno == 0 && dataLen > 0 {
		data = r.read(dataLen)
	}
	return cookie, errno, data
}

// closedByServer reports whether the server closed the connection.
func (r *rawNBD) closedByServer() bool {
	_, err := r.c.Read(make([]byte, 1))
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		return false
	}
	return true
}
