package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"tern/volume/ids"
	"tern/volume/layout"
	"tern/volume/nbd"
)

// NBDScenarios are the IO shapes of `tern bench nbd`, in the order they
// run (the sequential write fills the volume the reads then read).
var NBDScenarios = []IOShape{
	{Name: "seqwrite_1m_qd32", Write: true, BlockBytes: 1 << 20, QueueDepth: 32},
	{Name: "randwrite_4k_qd32", Write: true, Random: true, BlockBytes: 4096, QueueDepth: 32},
	{Name: "randread_4k_qd32", Random: true, BlockBytes: 4096, QueueDepth: 32},
}

// NBDTargetRatio is the promise: NBD-served IOPS at least this fraction
// of the upstairs driven directly, in every scenario.
const NBDTargetRatio = 0.8

// NBDOptions configure RunNBD.
type NBDOptions struct {
	// Duration of each measurement (four per scenario).
	Duration time.Duration
	// VolumeBytes is the volume's size (and the peers').
	VolumeBytes uint64
	// Dir holds the regions, certificates and the peers' files; empty
	// means a temporary one.
	Dir string
	// Progress, when set, gets a line as each measurement starts.
	Progress io.Writer
}

// Measured is one measurement's figures.
type Measured struct {
	IOPS      float64 `json:"iops"`
	MiBPerSec float64 `json:"mib_per_sec"`
	P50us     float64 `json:"p50_us"`
	P99us     float64 `json:"p99_us"`
}

// NBDScenario is one row of the report (JSON keys are a contract).
type NBDScenario struct {
	Scenario      string  `json:"scenario"`
	NBDIOPS       float64 `json:"nbd_iops"`
	NBDMiBPerSec  float64 `json:"nbd_mib_per_sec"`
	NBDP50us      float64 `json:"nbd_p50_us"`
	NBDP99us      float64 `json:"nbd_p99_us"`
	DirectIOPS    float64 `json:"direct_iops"`
	DirectMiBPSec float64 `json:"direct_mib_per_sec"`
	DirectP50us   float64 `json:"direct_p50_us"`
	DirectP99us   float64 `json:"direct_p99_us"`
	// NBDToDirect is NBDIOPS / DirectIOPS, the figure the target uses.
	NBDToDirect float64 `json:"nbd_to_direct"`
	Target      float64 `json:"target_nbd_to_direct"`
	// NbdkitMemory is fio against `nbdkit memory`: the NBD path alone.
	NbdkitMemory Measured `json:"nbdkit_memory"`
	// QemuNBDFile is fio against qemu-nbd on a local raw file: no
	// replication at all.
	QemuNBDFile Measured `json:"qemu_nbd_file"`
}

// RunNBD starts three downstairs on loopback, activates an upstairs,
// serves it over NBD on a unix socket and, for every scenario, measures
// fio's nbd engine against it, the same shape driven on the upstairs
// directly, and fio against nbdkit's memory plugin and qemu-nbd on a
// local file. It returns one row per scenario.
func RunNBD(ctx context.Context, opts NBDOptions) ([]NBDScenario, error) {
	if opts.Duration <= 0 {
		opts.Duration = 10 * time.Second
	}
	if opts.VolumeBytes == 0 {
		opts.VolumeBytes = 256 << 20
	}
	for _, tool := range []string{"fio", "nbdkit", "qemu-nbd"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("tern bench nbd needs %s (Debian: fio, nbdkit, qemu-utils): %w", tool, err)
		}
	}
	cl, cleanup, err := newCluster(opts.Dir, "tern-bench-nbd", opts.VolumeBytes)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	say := sayer(opts.Progress)
	if err := cl.StartAll(); err != nil {
		return nil, err
	}
	defer cl.Close()
	up, err := layout.Open(layout.Replicated, layout.Config{Targets: cl.Targets(), TLS: cl.ClientTLS})
	if err != nil {
		return nil, err
	}
	defer up.Close()
	if err := up.Activate(ctx, ids.Generation(1)); err != nil {
		return nil, fmt.Errorf("activating volume: %w", err)
	}
	space := int64(cl.Spec.SizeBytes())
	srv, err := nbd.NewServer(nbd.Config{Export: nbd.Export{
		Device: up, Size: uint64(space), BlockSize: cl.Spec.BlockSize,
	}})
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(cl.Dir, "nbd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("listening for NBD: %w", err)
	}
	go srv.Serve(ln)
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	}()
	volumeURI := "nbd+unix:///?socket=" + sock

	qemuFile := filepath.Join(cl.Dir, "qemu-nbd.raw")
	if err := os.WriteFile(qemuFile, nil, 0o644); err != nil {
		return nil, err
	}
	if err := os.Truncate(qemuFile, space); err != nil {
		return nil, err
	}
	qemu, err := startQemuNBD(ctx, qemuFile, filepath.Join(cl.Dir, "qemu-nbd.sock"))
	if err != nil {
		return nil, err
	}
	defer qemu.stop()

	var rows []NBDScenario
	for _, shape := range NBDScenarios {
		say("%s: fio over NBD on the volume", shape.Name)
		viaNBD, err := runFio(ctx, shape, space, opts.Duration, "", volumeURI)
		if err != nil {
			return nil, fmt.Errorf("%s over NBD: %w", shape.Name, err)
		}
		if shape.Write {
			if err := up.Flush(ctx); err != nil {
				return nil, fmt.Errorf("flushing after %s: %w", shape.Name, err)
			}
		}
		say("%s: the upstairs directly", shape.Name)
		direct, err := volumeLoad(ctx, up, shape, space, opts.Duration)
		if err != nil {
			return nil, fmt.Errorf("%s on the upstairs: %w", shape.Name, err)
		}
		say("%s: fio against nbdkit memory", shape.Name)
		mem, err := runFio(ctx, shape, space, opts.Duration, "nbdkit", "")
		if err != nil {
			return nil, fmt.Errorf("%s against nbdkit memory: %w", shape.Name, err)
		}
		say("%s: fio against qemu-nbd on a local file", shape.Name)
		qf, err := runFio(ctx, shape, space, opts.Duration, "", qemu.uri)
		if err != nil {
			return nil, fmt.Errorf("%s against qemu-nbd: %w", shape.Name, err)
		}
		rows = append(rows, NBDScenario{
			Scenario: shape.Name,
			NBDIOPS:  viaNBD.IOPS, NBDMiBPerSec: viaNBD.MiBPerSec, NBDP50us: viaNBD.P50us, NBDP99us: viaNBD.P99us,
			DirectIOPS: direct.IOPS(), DirectMiBPSec: direct.MiBPerSec(),
			DirectP50us: micros(direct.Percentile(0.50)), DirectP99us: micros(direct.Percentile(0.99)),
			NBDToDirect:  viaNBD.IOPS / direct.IOPS(),
			Target:       NBDTargetRatio,
			NbdkitMemory: mem,
			QemuNBDFile:  qf,
		})
	}
	return rows, nil
}

// fioJob is the fio command line for shape against uri.
func fioJob(shape IOShape, spaceBytes int64, d time.Duration, uri string) []string {
	rw := "read"
	switch {
	case shape.Write && shape.Random:
		rw = "randwrite"
	case shape.Write:
		rw = "write"
	case shape.Random:
		rw = "randread"
	}
	return []string{
		"--name=" + shape.Name, "--ioengine=nbd", "--uri=" + uri, "--rw=" + rw,
		"--bs=" + strconv.Itoa(shape.BlockBytes), "--iodepth=" + strconv.Itoa(shape.QueueDepth),
		"--size=" + strconv.FormatInt(spaceBytes, 10), "--time_based", "--runtime=" + strconv.Itoa(int(max(d.Seconds(), 1))),
		"--output-format=json",
	}
}

// runFio runs one fio job against uri, or, with wrap "nbdkit", against a
// fresh `nbdkit memory` of spaceBytes that lives for the job.
func runFio(ctx context.Context, shape IOShape, spaceBytes int64, d time.Duration, wrap, uri string) (Measured, error) {
	var cmd *exec.Cmd
	if wrap == "nbdkit" {
		// nbdkit --run starts fio once it serves, with $uri set, and
		// exits when fio does.
		job := fioJob(shape, spaceBytes, d, "$uri")
		for i, a := range job {
			job[i] = "'" + a + "'"
		}
		job[2] = `"--uri=$uri"`
		cmd = exec.CommandContext(ctx, "nbdkit", "-U", "-", "memory", "size="+strconv.FormatInt(spaceBytes, 10),
			"--run", "fio "+strings.Join(job, " "))
	} else {
		cmd = exec.CommandContext(ctx, "fio", fioJob(shape, spaceBytes, d, uri)...)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return Measured{}, fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return parseFio(stdout.Bytes(), shape.Write)
}

// parseFio reads the first job of fio's JSON output (after any lines fio
// printed before it).
func parseFio(out []byte, write bool) (Measured, error) {
	if i := bytes.IndexByte(out, '{'); i >= 0 {
		out = out[i:]
	}
	type side struct {
		IOPS    float64 `json:"iops"`
		BWBytes float64 `json:"bw_bytes"`
		Clat    struct {
			Percentile map[string]float64 `json:"percentile"`
		} `json:"clat_ns"`
	}
	var res struct {
		Jobs []struct {
			Error int  `json:"error"`
			Read  side `json:"read"`
			Write side `json:"write"`
		} `json:"jobs"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		return Measured{}, fmt.Errorf("reading fio's JSON: %w", err)
	}
	if len(res.Jobs) == 0 {
		return Measured{}, fmt.Errorf("fio reported no job")
	}
	j := res.Jobs[0]
	if j.Error != 0 {
		return Measured{}, fmt.Errorf("fio job failed with error %d", j.Error)
	}
	s := j.Read
	if write {
		s = j.Write
	}
	return Measured{
		IOPS: s.IOPS, MiBPerSec: s.BWBytes / (1 << 20),
		P50us: s.Clat.Percentile["50.000000"] / 1e3, P99us: s.Clat.Percentile["99.000000"] / 1e3,
	}, nil
}

// qemuNBD is a qemu-nbd serving a local file.
type qemuNBD struct {
	pid int
	uri string
}

// startQemuNBD serves file with qemu-nbd on sock; --fork returns once it
// is serving.
func startQemuNBD(ctx context.Context, file, sock string) (*qemuNBD, error) {
	pidFile := sock + ".pid"
	out, err := exec.CommandContext(ctx, "qemu-nbd", "--fork", "--pid-file="+pidFile, "--persistent",
		"--shared=4", "-f", "raw", "-k", sock, file).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("starting qemu-nbd: %v: %s", err, bytes.TrimSpace(out))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return nil, fmt.Errorf("reading qemu-nbd's pid: %w", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("reading qemu-nbd's pid: %w", err)
	}
	return &qemuNBD{pid: pid, uri: "nbd+unix:///?socket=" + sock}, nil
}

func (q *qemuNBD) stop() { _ = syscall.Kill(q.pid, syscall.SIGTERM) }

// WriteNBDTable prints the report for people.
func WriteNBDTable(w io.Writer, rows []NBDScenario) {
	fmt.Fprintf(w, "%-18s %9s %8s %8s %8s | %9s %8s %8s %8s | %7s %-10s | %9s %9s\n",
		"scenario", "nbd iops", "MiB/s", "p50 µs", "p99 µs", "direct", "MiB/s", "p50 µs", "p99 µs", "×direct", "target", "nbdkit", "qemu-nbd")
	for _, r := range rows {
		verdict := "met"
		if r.NBDToDirect < r.Target {
			verdict = "MISSED"
		}
		fmt.Fprintf(w, "%-18s %9.0f %8.1f %8.0f %8.0f | %9.0f %8.1f %8.0f %8.0f | %7.2f ≥%.1f %-6s | %9.0f %9.0f\n",
			r.Scenario, r.NBDIOPS, r.NBDMiBPerSec, r.NBDP50us, r.NBDP99us,
			r.DirectIOPS, r.DirectMiBPSec, r.DirectP50us, r.DirectP99us,
			r.NBDToDirect, r.Target, verdict, r.NbdkitMemory.IOPS, r.QemuNBDFile.IOPS)
	}
}
