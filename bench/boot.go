package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"tern/internal/kvmhost"
	"tern/vmm"
	"tern/vmm/guests"
	"tern/vmm/kvm"
)

// BootOptions configure RunBoot.
type BootOptions struct {
	// Tern is the tern binary whose `vmm run --guest hello` is timed.
	Tern string
	// Runs is the number of samples of each kind (default 20).
	Runs int
	// Progress, when set, gets a line as each step starts.
	Progress io.Writer
}

// BootStats are one measured kind's medians and 90th percentiles: wall
// time and CPU time (user+system) in milliseconds, peak RSS in MiB.
type BootStats struct {
	WallP50 float64 `json:"wall_ms_p50"`
	WallP90 float64 `json:"wall_ms_p90"`
	CPUP50  float64 `json:"cpu_ms_p50"`
	CPUP90  float64 `json:"cpu_ms_p90"`
	RSSP50  float64 `json:"rss_mib_p50"`
	RSSP90  float64 `json:"rss_mib_p90"`
}

// BootReport is the JSON `tern bench boot --json` writes. The first seven
// keys are a contract; the qemu_ ones and ratio_wall are null when QEMU
// is absent, and QEMUSkipped says why.
type BootReport struct {
	TernWallP50   float64  `json:"tern_wall_ms_p50"`
	QEMUWallP50   *float64 `json:"qemu_wall_ms_p50"`
	RatioWall     *float64 `json:"ratio_wall"`
	TernRSS       float64  `json:"tern_rss_mib"`
	QEMURSS       *float64 `json:"qemu_rss_mib"`
	InprocBootP50 float64  `json:"inproc_boot_ms_p50"`
	BareKVMP50    float64  `json:"bare_kvm_ms_p50"`

	Runs        int    `json:"runs"`
	QEMUSkipped string `json:"qemu_skipped,omitempty"`
	// Whole process, spawn to exit, from the child's rusage.
	Tern BootStats  `json:"tern_process"`
	QEMU *BootStats `json:"qemu_process"`
	// In this process: vmm.New to the guest's boot-timer write, and
	// kvm.Probe (open /dev/kvm, a VM with one page, a vCPU run to HLT).
	// CPU is this process's (all threads); RSS its peak so far.
	Inproc  BootStats `json:"inproc_boot"`
	BareKVM BootStats `json:"bare_kvm"`
	// Ratios the targets bound (InprocOverBare always; RSS with QEMU).
	InprocOverBare float64  `json:"inproc_over_bare_kvm"`
	RatioRSS       *float64 `json:"ratio_rss"`
}

// Targets of the boot benchmark.
const (
	// TargetBootWallRatio bounds tern's whole-process median over QEMU's.
	TargetBootWallRatio = 0.2
	// TargetInprocOverBare bounds the in-process create→boot-timer median
	// over the bare KVM baseline's.
	TargetInprocOverBare = 3.0
	// TargetBootRSSRatio bounds tern's median peak RSS over QEMU's.
	TargetBootRSSRatio = 0.3
	// TargetBootRSSMiB bounds tern's median peak RSS itself: a vmm
	// process carries only its layer (no control plane, agent or
	// benchmarks: those are other binaries).
	TargetBootRSSMiB = 12.0
)

// sample is one measurement.
type sample struct {
	wall, cpu time.Duration
	rssKiB    int64
}

type samples []sample

func (s samples) stats() BootStats {
	var wall, cpu, rss []time.Duration
	for _, x := range s {
		wall = append(wall, x.wall)
		cpu = append(cpu, x.cpu)
		// KiB carried as a Duration so percentileMs sorts it; converted back.
		rss = append(rss, time.Duration(x.rssKiB)*time.Millisecond)
	}
	mib := func(q float64) float64 { return percentileMs(rss, q) / 1024 }
	return BootStats{
		WallP50: percentileMs(wall, 0.5), WallP90: percentileMs(wall, 0.9),
		CPUP50: percentileMs(cpu, 0.5), CPUP90: percentileMs(cpu, 0.9),
		RSSP50: mib(0.5), RSSP90: mib(0.9),
	}
}

// ErrNoQEMU is QEMUSkipped's cause when qemu-system-x86_64 is not on PATH.
var ErrNoQEMU = errors.New("qemu-system-x86_64 not found on PATH: the QEMU peer was skipped (apt-get install qemu-system-x86)")

// RunBoot measures booting the hello guest: `tern vmm run` against QEMU
// microvm on the same ELF, alternating, whole process; then in this
// process vmm.New→boot timer and the bare KVM baseline. It refuses to run
// inside the emulated test host, and needs /dev/kvm.
func RunBoot(ctx context.Context, opts BootOptions) (*BootReport, error) {
	if err := kvmhost.RefuseBenchmark(); err != nil {
		return nil, err
	}
	if opts.Runs <= 0 {
		opts.Runs = 20
	}
	say := func(format string, args ...any) {
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, "bench boot: "+format+"\n", args...)
		}
	}
	if err := kvm.Probe(); err != nil {
		return nil, fmt.Errorf("the boot benchmark needs a usable /dev/kvm: %w", err)
	}
	dir, err := os.MkdirTemp("", "tern-bench-boot-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	elfBytes, err := guests.ELF("hello")
	if err != nil {
		return nil, err
	}
	elfPath := filepath.Join(dir, "hello.elf")
	if err := os.WriteFile(elfPath, elfBytes, 0o644); err != nil {
		return nil, err
	}
	r := &BootReport{Runs: opts.Runs}
	qemu, qerr := exec.LookPath("qemu-system-x86_64")
	if qerr != nil {
		qemu, r.QEMUSkipped = "", ErrNoQEMU.Error()
		say("%s", r.QEMUSkipped)
	}
	ternArgs := []string{opts.Tern, "vmm", "run", "--guest", "hello", "--timeout", "60s"}
	qemuArgs := append(append([]string{qemu, "-enable-kvm"}, guests.QEMUMachineArgs()...), "-m", "128M",
		"-nodefaults", "-no-reboot", "-nographic", "-display", "none", "-serial", "stdio",
		"-device", "isa-debug-exit,iobase=0xf4,iosize=0x04", "-kernel", elfPath)

	say("%d whole-process runs of tern vmm run --guest hello%s (plus one warm-up)", opts.Runs, map[bool]string{true: " alternating with QEMU microvm", false: ""}[qemu != ""])
	var ternS, qemuS samples
	for i := -1; i < opts.Runs; i++ {
		s, err := runProcess(ctx, ternArgs, 0)
		if err != nil {
			return nil, err
		}
		if i >= 0 {
			ternS = append(ternS, s)
		}
		if qemu == "" {
			continue
		}
		// isa-debug-exit: QEMU exits with (status<<1)|1, so 1 for hello's 0.
		if s, err = runProcess(ctx, qemuArgs, 1); err != nil {
			return nil, err
		}
		if i >= 0 {
			qemuS = append(qemuS, s)
		}
	}

	say("%d in-process boots (vmm.New → boot timer) and bare KVM probes, alternating", opts.Runs)
	var inS, bareS samples
	for i := -1; i < opts.Runs; i++ {
		s, err := inprocBoot(ctx)
		if err != nil {
			return nil, err
		}
		b, err := measureInproc(kvm.Probe)
		if err != nil {
			return nil, fmt.Errorf("bare KVM baseline: %w", err)
		}
		if i >= 0 {
			inS, bareS = append(inS, s), append(bareS, b)
		}
	}

	r.Tern, r.Inproc, r.BareKVM = ternS.stats(), inS.stats(), bareS.stats()
	r.TernWallP50, r.TernRSS = r.Tern.WallP50, r.Tern.RSSP50
	r.InprocBootP50, r.BareKVMP50 = r.Inproc.WallP50, r.BareKVM.WallP50
	if r.BareKVMP50 > 0 {
		r.InprocOverBare = r.InprocBootP50 / r.BareKVMP50
	}
	if qemu != "" {
		q := qemuS.stats()
		r.QEMU = &q
		wall, rss := q.WallP50, q.RSSP50
		ratio, ratioRSS := r.TernWallP50/wall, r.TernRSS/rss
		r.QEMUWallP50, r.QEMURSS, r.RatioWall, r.RatioRSS = &wall, &rss, &ratio, &ratioRSS
	}
	return r, nil
}

// runProcess runs args[0] with args[1:] and times it from spawn to exit;
// CPU time and peak RSS come from its rusage. It must exit with want.
func runProcess(ctx context.Context, args []string, want int) (sample, error) {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if cmd.ProcessState == nil {
		return sample{}, fmt.Errorf("running %s: %w", args[0], err)
	}
	if code := cmd.ProcessState.ExitCode(); code != want {
		return sample{}, fmt.Errorf("%s exited with %d, want %d: %v\nstdout: %s\nstderr: %s", filepath.Base(args[0]), code, want, err, out.Bytes(), errOut.Bytes())
	}
	if !bytes.Contains(out.Bytes(), []byte("Hello")) {
		return sample{}, fmt.Errorf("%s: the hello guest printed nothing recognisable: %q", filepath.Base(args[0]), out.Bytes())
	}
	ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	if !ok {
		return sample{}, fmt.Errorf("%s: no rusage", args[0])
	}
	return sample{wall: wall, cpu: tvDuration(ru.Utime) + tvDuration(ru.Stime), rssKiB: ru.Maxrss}, nil
}

func tvDuration(tv syscall.Timeval) time.Duration {
	return time.Duration(tv.Sec)*time.Second + time.Duration(tv.Usec)*time.Microsecond
}

// measureInproc times f in this process: wall, this process's CPU time
// spent meanwhile, and its peak RSS after.
func measureInproc(f func() error) (sample, error) {
	var before, after unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &before); err != nil {
		return sample{}, err
	}
	start := time.Now()
	err := f()
	wall := time.Since(start)
	if err != nil {
		return sample{}, err
	}
	if err := unix.Getrusage(unix.RUSAGE_SELF, &after); err != nil {
		return sample{}, err
	}
	cpu := time.Duration(unix.TimevalToNsec(after.Utime)+unix.TimevalToNsec(after.Stime)) -
		time.Duration(unix.TimevalToNsec(before.Utime)+unix.TimevalToNsec(before.Stime))
	return sample{wall: wall, cpu: cpu, rssKiB: after.Maxrss}, nil
}

// inprocBoot builds a VM with the hello guest (128 MiB, as tern vmm run)
// and times vmm.New until the guest writes the boot timer; Run, Stop and
// Close fall outside the figure.
func inprocBoot(ctx context.Context) (sample, error) {
	var vm *vmm.VM
	var done chan error
	s, err := measureInproc(func() error {
		var err error
		if vm, err = vmm.New(vmm.Config{Guest: "hello", MemoryBytes: 128 << 20}); err != nil {
			return err
		}
		done = make(chan error, 1)
		go func() { _, err := vm.Run(ctx); done <- err }()
		select {
		case <-vm.BootTimer().Done():
			return nil
		case err := <-done:
			return fmt.Errorf("hello guest ended before writing the boot timer: %v", err)
		case <-time.After(time.Minute):
			return errors.New("hello guest did not write the boot timer within a minute")
		}
	})
	if vm != nil {
		vm.Stop()
		if done != nil {
			<-done
		}
		if cerr := vm.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}
	return s, err
}

// WriteTable prints the report for people, each figure beside its target.
func (r *BootReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "%d runs of each kind; hello guest; wall and CPU in ms, peak RSS in MiB\n", r.Runs)
	fmt.Fprintf(w, "%-42s %9s %9s %9s %9s %9s %9s\n", "kind", "wall p50", "wall p90", "cpu p50", "cpu p90", "rss p50", "rss p90")
	row := func(name string, s BootStats) {
		fmt.Fprintf(w, "%-42s %9.2f %9.2f %9.2f %9.2f %9.1f %9.1f\n", name, s.WallP50, s.WallP90, s.CPUP50, s.CPUP90, s.RSSP50, s.RSSP90)
	}
	row("tern vmm run (whole process)", r.Tern)
	if r.QEMU != nil {
		row("qemu microvm -enable-kvm (whole process)", *r.QEMU)
	} else {
		fmt.Fprintf(w, "%-42s %s\n", "qemu microvm (whole process)", "skipped: "+r.QEMUSkipped)
	}
	row("in-process vmm.New → boot timer", r.Inproc)
	row("bare KVM: VM, one page, run to HLT", r.BareKVM)
	fmt.Fprintln(w, "(in-process CPU is the benchmark process's, all threads; its RSS is that process's peak so far)")
	if r.RatioWall != nil {
		fmt.Fprintf(w, "tern / qemu whole-process wall p50 = %.3f (target ≤ %.2f %s)\n", *r.RatioWall, TargetBootWallRatio, met(*r.RatioWall <= TargetBootWallRatio))
		fmt.Fprintf(w, "tern / qemu peak RSS p50 = %.3f (target ≤ %.2f %s)\n", *r.RatioRSS, TargetBootRSSRatio, met(*r.RatioRSS <= TargetBootRSSRatio))
	} else {
		fmt.Fprintf(w, "tern / qemu ratios: not measured (%s)\n", r.QEMUSkipped)
	}
	fmt.Fprintf(w, "tern peak RSS p50 = %.1f MiB (target ≤ %.0f MiB %s)\n", r.Tern.RSSP50, TargetBootRSSMiB, met(r.Tern.RSSP50 <= TargetBootRSSMiB))
	fmt.Fprintf(w, "in-process boot / bare KVM p50 = %.2f (target ≤ %.1f %s)\n", r.InprocOverBare, TargetInprocOverBare, met(r.InprocOverBare <= TargetInprocOverBare))
}
