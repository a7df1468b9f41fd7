package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"

	"tern/internal/child"
	"tern/internal/tlsconf"
	"tern/internal/units"
	"tern/volume/extent"
	"tern/volume/ids"
)

// StartTimeout bounds how long a downstairs process may take to log that
// it listens: generous, as the machine may be busy.
const StartTimeout = time.Minute

// Cluster is three `tern downstairs` processes serving one region, each
// from its own directory, sharing development certificates.
type Cluster struct {
	Bin         string // the tern binary
	Certs       string
	Replicas    [3]*Replica
	totalBlocks uint64
}

// ClusterSpec is the region geometry and where each replica runs.
type ClusterSpec struct {
	ExtentSize  string // a --extent-size value
	ExtentCount int
	// Hosts, if set, run replica i in Hosts[i] listening on its address;
	// otherwise replicas listen on loopback.
	Hosts [3]*Host
	// Port is the UDP port replicas listen on in their hosts (0: any).
	Port int
}

// BlockSize is the block size of every region a Cluster creates.
const BlockSize = 4096

// NewCluster creates certificates and three regions of spec under dir
// with bin (`tern certs init`, `tern downstairs create`). It starts
// nothing.
func NewCluster(bin, dir string, spec ClusterSpec) (*Cluster, error) {
	extentBytes, err := units.ParseBytes(spec.ExtentSize)
	if err != nil {
		return nil, fmt.Errorf("parsing extent size: %w", err)
	}
	c := &Cluster{Bin: bin, Certs: filepath.Join(dir, "certs"), totalBlocks: extentBytes / BlockSize * uint64(spec.ExtentCount)}
	if err := runQuiet(bin, "certs", "init", "--dir", c.Certs); err != nil {
		return nil, fmt.Errorf("creating certificates: %w", err)
	}
	id := uuid.NewString()
	for i := range c.Replicas {
		r := &Replica{bin: bin, certs: c.Certs, Dir: filepath.Join(dir, "r"+strconv.Itoa(i)),
			host: spec.Hosts[i], listen: "127.0.0.1:0"}
		if r.host != nil {
			r.listen = fmt.Sprintf("%s:%d", r.host.IP, spec.Port)
		}
		if err := runQuiet(bin, "downstairs", "create", "--dir", r.Dir, "--uuid", id,
			"--block-size", strconv.Itoa(BlockSize), "--extent-size", spec.ExtentSize,
			"--extent-count", strconv.Itoa(spec.ExtentCount)); err != nil {
			return nil, fmt.Errorf("creating region %d: %w", i, err)
		}
		c.Replicas[i] = r
	}
	return c, nil
}

// StartAll starts every replica that is not running.
func (c *Cluster) StartAll() error {
	for i, r := range c.Replicas {
		if r.Running() {
			continue
		}
		if err := r.Start(); err != nil {
			return fmt.Errorf("starting replica %d: %w", i, err)
		}
	}
	return nil
}

// StopAll stops every running replica with SIGTERM.
func (c *Cluster) StopAll() error {
	var errs []error
	for _, r := range c.Replicas {
		errs = append(errs, r.Stop())
	}
	return errors.Join(errs...)
}

// Addrs are the replicas' addresses (empty before the first start).
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Replicas))
	for i, r := range c.Replicas {
		out[i] = r.Addr
	}
	return out
}

// Blocks is the volume's size in blocks of BlockSize.
func (c *Cluster) Blocks() uint64 { return c.totalBlocks }

// Bundle loads the cluster's certificates.
func (c *Cluster) Bundle() (*tlsconf.Bundle, error) { return tlsconf.Load(c.Certs) }

// Replica is one downstairs process, restartable on the address it first
// listened on.
type Replica struct {
	bin, certs, listen string
	host               *Host
	// Dir is the region directory; Addr where it listens once started.
	Dir  string
	Addr string
	// mu guards proc, which a sampler reads while the owner restarts.
	mu   sync.Mutex
	proc *child.Process // nil when not running
	// Starts and Kills count Start and Kill calls that succeeded.
	Starts, Kills int
}

// Running says whether the process was started and not stopped or killed.
func (r *Replica) Running() bool { return r.getProc() != nil }

func (r *Replica) getProc() *child.Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.proc
}

func (r *Replica) setProc(p *child.Process) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.proc = p
}

// takeProc returns the running process, if any, and forgets it.
func (r *Replica) takeProc() *child.Process {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.proc
	r.proc = nil
	return p
}

// PID is the running process's id, or 0.
func (r *Replica) PID() int {
	if p := r.getProc(); p != nil {
		return p.Cmd.Process.Pid
	}
	return 0
}

// Start runs `tern downstairs run` and waits for its "listening" record.
func (r *Replica) Start() error {
	if r.Running() {
		return errors.New("starting replica: already running")
	}
	listen := r.listen
	if r.Addr != "" {
		listen = r.Addr
	}
	args := []string{"downstairs", "run", "--dir", r.Dir, "--listen", listen, "--certs", r.certs}
	var cmd *exec.Cmd
	if r.host != nil {
		cmd = r.host.Command(r.bin, args...)
	} else {
		cmd = exec.Command(r.bin, args...)
	}
	var lastErr lastErrorRecord
	p, addr, err := child.Start(cmd, child.Options{Ready: child.Ready{Match: child.ListeningAddr, Stderr: true, Log: &lastErr,
		Wait: StartTimeout, What: "its listening record"}})
	if err != nil {
		return fmt.Errorf("replica %s: %w (%s)", r.Dir, err, lastErr.String())
	}
	r.Addr = addr
	r.setProc(p)
	r.Starts++
	return nil
}

// lastErrorRecord keeps the last ERROR record of a downstairs' log, for
// the error that says why it did not start.
type lastErrorRecord struct {
	mu   sync.Mutex
	line string
}

// Write takes one log line.
func (l *lastErrorRecord) Write(line []byte) (int, error) {
	var rec struct {
		Level string `json:"level"`
	}
	if json.Unmarshal(line, &rec) == nil && rec.Level == "ERROR" {
		l.mu.Lock()
		l.line = strings.TrimSuffix(string(line), "\n")
		l.mu.Unlock()
	}
	return len(line), nil
}

func (l *lastErrorRecord) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.line
}

// Kill ends the process with SIGKILL, the way a crash does, and waits for
// it to exit.
func (r *Replica) Kill() error {
	p := r.takeProc()
	if p == nil {
		return nil
	}
	p.Kill()
	r.Kills++
	return nil
}

// Stop ends the process with SIGTERM, or SIGKILL after 10 s.
func (r *Replica) Stop() error {
	if p := r.takeProc(); p != nil {
		p.Stop(10 * time.Second)
	}
	return nil
}

// CompareRegions opens every replica's region (their processes must be
// stopped) and returns the blocks whose contents are not the same on all
// three, at most limit of them.
func (c *Cluster) CompareRegions(ctx context.Context, limit int) ([]ids.BlockIndex, error) {
	var regions [3]*extent.Region
	for i, r := range c.Replicas {
		reg, err := extent.Open(r.Dir)
		if err != nil {
			return nil, fmt.Errorf("opening region %d: %w", i, err)
		}
		defer reg.Close()
		regions[i] = reg
	}
	spec := regions[0].Spec()
	total := ids.BlockIndex(uint64(spec.ExtentBlocks) * uint64(spec.ExtentCount))
	bs := int(spec.BlockSize)
	var bufs [3][]byte
	var hashes [3][]uint64
	for i := range bufs {
		bufs[i], hashes[i] = make([]byte, bs), make([]uint64, 1)
	}
	var differ []ids.BlockIndex
	for b := ids.BlockIndex(0); b < total; b++ {
		if ctx.Err() != nil {
			return differ, ctx.Err()
		}
		for i, reg := range regions {
			if err := reg.ReadBlocks(b, bufs[i], hashes[i]); err != nil {
				return differ, fmt.Errorf("reading block %d of region %d: %w", b, i, err)
			}
		}
		if string(bufs[0]) != string(bufs[1]) || string(bufs[0]) != string(bufs[2]) {
			differ = append(differ, b)
			if len(differ) >= limit {
				break
			}
		}
	}
	return differ, nil
}

func runQuiet(bin string, args ...string) error {
	out, err := exec.Command(bin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("running tern %v: %w: %s", args, err, out)
	}
	return nil
}
