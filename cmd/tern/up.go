package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"tern/instance/apiv1"
	"tern/instance/client"
	"tern/internal/tlsconf"
	"tern/vmm/kvm"
	"tern/vmm/linuxguest"
	"tern/volume/downstairs"
	"tern/volume/ec"
	"tern/volume/extent"
	"tern/volume/ids"
)

func init() { rootCmd.AddCommand(newUpCmd()) }

// The volume `tern up` creates is made of 512-byte blocks in 1 MiB
// extents; how many extents depends on the guest (upGuest.extentCount).
const (
	upBlockSize    = 512
	upExtentBlocks = 2048
)

// Bounds of `tern up`'s phases. Start-up waits are generous (the
// emulated test host boots for tens of seconds on a busy machine);
// shutdown fits in 10 s: the vmm gets upVMMGrace to destroy its instance,
// then the downstairs get upDownstairsGrace.
const (
	upStartWait       = 30 * time.Second
	upVMMGrace        = 5 * time.Second
	upDownstairsGrace = 3 * time.Second
)

// upKVMHostEnv is the variable that forces (always) or forbids (never)
// the emulated test host, as for the KVM tests.
const upKVMHostEnv = "TERN_KVMHOST"

func newUpCmd() *cobra.Command {
	var dataDir, layout, guest string
	var hosts int
	cmd := &cobra.Command{
		Use:   "up [--data-dir DIR] [--guest demo|linux] [--layout ec:K+M] [--hosts N]",
		Short: "Run three downstairs, a vmm and a demo guest (or Linux) on a volume, all on loopback",
		Long: `Create certificates and three regions under --data-dir (default: a new
temporary directory, removed on exit), start three downstairs and a vmm on
loopback as child processes, and ensure an instance running the demo
guest on a replicated volume (with --layout ec:K+M, K+M regions and
downstairs and an erasure-coded volume). It prints the API's URL first
("API: http://127.0.0.1:PORT"), then commands to try, then streams the
guest's serial console; lines typed on a terminal go to the guest. A
child that ends on its own gets one line naming it and how it ended
("tern up: downstairs 2 (pid N) ended: signal: killed"); the rest carry
on. SIGINT or SIGTERM stops every child and exits within 10 s.

With --guest linux the instance boots Linux instead of the demo guest:
Debian's stock kernel and a busybox and e2fsprogs userland, built from
Debian packages with apt-get download on first use (as tern guests linux
does) and cached in $` + linuxguest.CacheEnv + ` or the user's cache directory,
with 256 MiB of memory and the volume as /dev/vda (64 MiB; with --layout
ec:K+M, K shards of 64 MiB). Once it prints "` + linuxguest.ReadyLine + `" its
console is a root shell ("` + linuxguest.Prompt + `"): make a file system on the
volume, mount it, write to it; tern up prints commands to try.

Without a usable /dev/kvm (or with TERN_KVMHOST=always) the vmm runs
inside the emulated KVM test host (QEMU, software emulation: slow), with
its API port forwarded to the host's loopback. With --guest linux it does
so also where /dev/kvm is nested PVM's (kvm-pvm), which emulates a guest
kernel's own code in software and cannot boot Linux; Linux then takes a
minute or two to boot.

With --hosts N (3 to 8) it runs a control plane instead: tern control
and N agents on the loopback addresses 127.0.0.2 on, and the demo
instance created through it on a volume across three hosts. It prints
the control plane's URL first ("Control: http://127.0.0.1:PORT"), then
tern ctl commands to try (a drain of the demo's host among them), then
streams the demo's console, following it across migrations. This mode
needs a usable /dev/kvm and runs the demo guest only.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if guest != upGuestDemo && guest != upGuestLinux {
				return fmt.Errorf("--guest %q: want %s or %s", guest, upGuestDemo, upGuestLinux)
			}
			if cmd.Flags().Changed("hosts") {
				if cmd.Flags().Changed("layout") {
					return fmt.Errorf("--layout applies to the single-host demo, not --hosts")
				}
				if guest != upGuestDemo {
					return fmt.Errorf("--guest %s applies to the single-host demo: --hosts runs the demo guest only", guest)
				}
				return runUpHosts(cmd.Context(), dataDir, hosts, cmd.OutOrStdout())
			}
			l, err := parseLayout(layout)
			if err != nil {
				return err
			}
			var lp *ec.Layout
			if e, isEC := l.EC(); isEC {
				lp = &e
			}
			return runUp(cmd.Context(), dataDir, lp, guest, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", "", "directory for certificates, regions and logs (default: a temporary directory, removed on exit)")
	cmd.Flags().IntVar(&hosts, "hosts", 0, "run a control plane and this many host agents on loopback addresses (3 to 8) instead of one vmm")
	cmd.Flags().StringVar(&guest, "guest", upGuestDemo, "the guest on the volume: demo (tern's demo guest) or linux (Debian's kernel with a shell; built from Debian packages on first use)")
	cmd.Flags().StringVar(&layout, "layout", layoutReplicated, "the demo volume's layout: replicated (three downstairs) or ec:K+M (K+M downstairs; ec alone is ec:4+2)")
	return cmd
}

// upSession is what one `tern up` started; stop undoes it.
type upSession struct {
	out        io.Writer
	downstairs []*upChild
	vmm        vmmRunner
}

// vmmRunner is the vmm, a child process here or one inside the emulated
// test host.
type vmmRunner interface {
	// done is closed when the vmm ended on its own or was stopped.
	done() <-chan struct{}
	// stop ends the vmm within grace and returns once it is gone.
	stop(grace time.Duration)
	// describe says how it ended, once done.
	describe() string
}

// runUp runs the guest called guestName (upGuestDemo or upGuestLinux) on
// a replicated volume, or an erasure-coded one of layout when it is set.
func runUp(ctx context.Context, dataDir string, layout *ec.Layout, guestName string, out io.Writer) (err error) {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the tern executable: %w", err)
	}
	emulated, err := upNeedsEmulatedHost(out, guestName == upGuestLinux)
	if err != nil {
		return err
	}
	guest, err := prepareUpGuest(ctx, guestName, out)
	if err != nil {
		return err
	}
	if dataDir == "" {
		if dataDir, err = os.MkdirTemp("", "tern-up-"); err != nil {
			return fmt.Errorf("creating data directory: %w", err)
		}
		defer os.RemoveAll(dataDir)
	} else if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("creating data directory: %w", err)
	}
	fmt.Fprintf(out, "tern up: data, certificates and logs in %s\n", dataDir)
	certs := filepath.Join(dataDir, "certs")
	// 10.0.2.2 is the host as the emulated test host's network sees it.
	hosts := append(append([]string(nil), tlsconf.DefaultHosts...), upEmulatedHostAddr)
	if err := tlsconf.Generate(certs, hosts, false); err != nil && !errors.Is(err, tlsconf.ErrExists) {
		return fmt.Errorf("creating certificates: %w", err)
	}
	dirs, err := upRegions(dataDir, layout, guest)
	if err != nil {
		return err
	}
	gen, err := upNextGen(dataDir)
	if err != nil {
		return err
	}

	s := &upSession{out: out}
	defer s.stop()
	var targets []string
	for i, dir := range dirs {
		name := fmt.Sprintf("downstairs %d", i+1)
		c, addr, err := startUpDownstairs(self, name, dir, certs, filepath.Join(dataDir, fmt.Sprintf("r%d.log", i+1)), upStartWait, out)
		if err != nil {
			return err
		}
		s.downstairs = append(s.downstairs, c)
		targets = append(targets, addr)
	}
	var url string
	if emulated {
		var inside []string
		for _, t := range targets {
			inside = append(inside, upEmulatedHostAddr+":"+t[strings.LastIndexByte(t, ':')+1:])
		}
		targets = inside
		fmt.Fprintf(out, "tern up: booting the emulated test host (the first run fetches a Debian kernel; progress in %s)\n", filepath.Join(dataDir, "vmm.log"))
		s.vmm, url, err = startEmulatedVMM(ctx, self, certs, guest, filepath.Join(dataDir, "vmm.log"), out)
	} else {
		var c *upChild
		c, url, err = startUpVMM(self, certs, filepath.Join(dataDir, "vmm.log"), upStartWait, out)
		if err == nil {
			s.vmm = childVMM{c}
		}
	}
	if err != nil {
		return err
	}
	c, err := client.New(url, nil)
	if err != nil {
		return err
	}
	spec := upInstanceSpec(targets, layout, gen, guest)
	if err := ensureUpInstance(ctx, c, spec); err != nil {
		return err
	}
	// After the ensure, so that whoever reads the URL finds the instance.
	printUpIntro(out, self, url, dataDir, spec)
	console := startUpConsole(ctx, c, out)
	defer console.stop()
	failed := watchUpInstance(ctx, c, spec.Name)
	select {
	case <-ctx.Done():
		fmt.Fprintln(out, "\ntern up: stopping")
		return nil
	case err := <-failed:
		return err
	case <-s.vmm.done():
		if ctx.Err() != nil { // the emulated host's QEMU saw the signal too
			fmt.Fprintln(out, "\ntern up: stopping")
			return nil
		}
		return fmt.Errorf("running vmm: it stopped: %s", s.vmm.describe())
	}
}

// watchUpInstance follows the instance and reports, once, that it
// failed (a guest that triple-faulted, a volume that could not activate):
// tern up then exits saying why, rather than serving a console on which
// nothing will come. It reports nothing when ctx ends or the vmm goes
// away (tern up's own wait on the vmm says that).
func watchUpInstance(ctx context.Context, c *client.Client, name string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		if _, err := c.WaitFor(ctx, 0, func(s apiv1.View) bool { return s.State == apiv1.Failed }); err != nil {
			return
		}
		why := "the vmm gave no reason"
		if v, err := c.Get(ctx); err == nil && v.Error != "" {
			why = v.Error
		}
		ch <- fmt.Errorf("the %s instance failed: %s", name, why)
	}()
	return ch
}

// upNeedsEmulatedHost decides where the vmm runs (upVMMPlace) and says
// so in one line when it is the emulated test host.
func upNeedsEmulatedHost(out io.Writer, linux bool) (bool, error) {
	mode := os.Getenv(upKVMHostEnv)
	var probeErr error
	if mode != "always" {
		probeErr = kvm.Probe()
	}
	emulated, why, err := upVMMPlace(mode, probeErr, kvm.PVM(), linux)
	if emulated {
		fmt.Fprintf(out, "tern up: %s: running the vmm inside the emulated KVM test host (slow)\n", why)
	}
	return emulated, err
}

// upVMMPlace decides whether the vmm runs inside the emulated test host,
// from TERN_KVMHOST's mode ("", auto, always or never), what kvm.Probe
// said of /dev/kvm (not asked for always), whether it is kvm-pvm's
// (kvm.PVM) and whether the guest is Linux, which kvm-pvm cannot boot.
// why says what decided it.
func upVMMPlace(mode string, probeErr error, pvm, linux bool) (emulated bool, why string, err error) {
	switch mode {
	case "always":
		return true, upKVMHostEnv + "=always", nil
	case "", "auto", "never":
	default:
		return false, "", fmt.Errorf("%s=%q: want auto, always or never", upKVMHostEnv, mode)
	}
	switch {
	case probeErr != nil:
		why = fmt.Sprintf("no usable /dev/kvm (%v)", probeErr)
		if mode == "never" {
			return false, why, fmt.Errorf("no usable /dev/kvm: %w (and %s=never forbids the emulated test host)", probeErr, upKVMHostEnv)
		}
		return true, why, nil
	case pvm && linux:
		why = "/dev/kvm is nested PVM's (kvm-pvm), which emulates a guest kernel's own code in software, far too slow to boot Linux"
		if mode == "never" {
			return false, why, fmt.Errorf("--guest linux: %s (and %s=never forbids the emulated test host)", why, upKVMHostEnv)
		}
		return true, why, nil
	}
	return false, "", nil
}

// upRegions creates the three replicas of one region, or the K+M shards
// of an erasure-coded layout (or keeps those a previous run left in
// dataDir), sized for guest, and returns their directories.
func upRegions(dataDir string, layout *ec.Layout, guest upGuest) ([]string, error) {
	spec := extent.NewSpec(upBlockSize, upExtentBlocks, guest.extentCount)
	spec.UUID = uuid.New()
	var dirs []string
	n, prefix := 3, "r"
	if layout != nil {
		// Named for the layout: a data directory can hold both kinds.
		n, prefix = layout.Shards(), fmt.Sprintf("ec%d+%d-s", layout.Data, layout.Parity)
	}
	// And for the guest, whose volume is sized for it.
	prefix = guest.regionPrefix + prefix
	for i := range n {
		dir := filepath.Join(dataDir, fmt.Sprintf("%s%d", prefix, i+1))
		dirs = append(dirs, dir)
		if _, err := os.Stat(dir); err == nil {
			continue
		}
		if err := downstairs.Create(dir, spec); err != nil {
			return nil, fmt.Errorf("creating region %d: %w", i+1, err)
		}
	}
	return dirs, nil
}

// upNextGen returns a generation above every one a previous run in
// dataDir activated the volume with, and records it.
func upNextGen(dataDir string) (ids.Generation, error) {
	path := filepath.Join(dataDir, "gen")
	var gen uint64
	if b, err := os.ReadFile(path); err == nil {
		gen, _ = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	}
	gen++
	if err := os.WriteFile(path, []byte(strconv.FormatUint(gen, 10)+"\n"), 0o644); err != nil {
		return 0, fmt.Errorf("recording generation: %w", err)
	}
	return ids.Generation(gen), nil
}

// printUpIntro prints the API line (the first URL tern up prints) and
// the commands to try next: for the Linux guest, on its shell first.
func printUpIntro(out io.Writer, self, url, dataDir string, spec apiv1.Spec) {
	tern := self
	if strings.Contains(self, "go-build") { // `go run ./cmd/tern up`
		tern = "go run ./cmd/tern"
	}
	fmt.Fprintf(out, "API: %s\n", url)
	serialNote := "type a line: demo echoes it"
	if spec.Guest.Kind == apiv1.GuestLinux {
		serialNote = "the Linux shell"
		sectors := spec.Disks[0].Backend.VolumeSizeBytes() / upBlockSize
		fmt.Fprintf(out, `
Linux boots in seconds on KVM, in a minute or two in the emulated test
host. It prints %[1]q, then a shell's prompt %[2]q on
the console. Its /dev/vda is the volume. Try, on that shell (type here
when this is a terminal, or in tern instance serial):
  cat /sys/block/vda/size        (the volume: %[3]d sectors of 512 bytes)
  mkfs.ext4 -q /dev/vda && mkdir -p /mnt && mount /dev/vda /mnt
  echo hello >/mnt/hello && sync && cat /mnt/hello && df -h /mnt
  umount /mnt && e2fsck -fn /dev/vda
`, linuxguest.ReadyLine, linuxguest.Prompt, sectors)
	}
	fmt.Fprintf(out, `
Try, in another terminal:
  %[1]s instance get --server %[2]s
  %[1]s instance watch --server %[2]s
  %[1]s instance serial --server %[2]s    (%[4]s; Ctrl-] leaves)
  curl %[2]s/v1/instance
  %[1]s instance reboot --server %[2]s
Logs: %[3]s/*.log. Ctrl-C (SIGINT) or SIGTERM stops everything.

`, tern, url, dataDir, serialNote)
}

// upInstanceSpec is the instance tern up ensures: guest on a volume
// across targets, replicated or of layout.
func upInstanceSpec(targets []string, layout *ec.Layout, gen ids.Generation, guest upGuest) apiv1.Spec {
	wait := uint64(10_000)
	region := guest.region()
	backend := apiv1.BackendSpec{Kind: apiv1.BackendVolume, Targets: targets,
		Region: &region, Gen: gen, QuorumWaitMs: &wait}
	if layout != nil {
		backend.Layout = &apiv1.LayoutSpec{Kind: apiv1.LayoutEC, Data: layout.Data, Parity: layout.Parity}
	}
	return apiv1.Spec{ID: "demo", Name: "tern up " + guest.name, VCPUs: 1, MemoryMiB: guest.memoryMiB,
		Guest: guest.spec,
		Disks: []apiv1.DiskSpec{{Name: "vol", Backend: backend}},
		Init:  apiv1.InitSpec{Method: apiv1.InitSpecMethod}}
}

// ensureUpInstance ensures the instance of spec and asks it to run.
func ensureUpInstance(ctx context.Context, c *client.Client, spec apiv1.Spec) error {
	if _, err := c.Ensure(ctx, spec); err != nil {
		return fmt.Errorf("ensuring the %s instance: %w", spec.Name, describeAPIError(err))
	}
	if err := c.RequestState(ctx, apiv1.Run); err != nil {
		return fmt.Errorf("running the %s instance: %w", spec.Name, describeAPIError(err))
	}
	return nil
}

// upConsole copies the serial console to out and, when stdin is a
// terminal, typed lines to the guest.
type upConsole struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startUpConsole(ctx context.Context, c *client.Client, out io.Writer) *upConsole {
	ctx, cancel := context.WithCancel(ctx)
	u := &upConsole{cancel: cancel}
	u.wg.Go(func() {
		conn, err := c.Serial(ctx, 0)
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintf(out, "tern up: %v\n", err)
			}
			return
		}
		defer conn.CloseNow()
		if term.IsTerminal(int(os.Stdin.Fd())) {
			// Lines (cooked mode, so ^C stays SIGINT) go to the guest.
			// The reader may stay blocked in read(2) at exit; it is the
			// process's, which exits right after.
			go func() {
				buf := make([]byte, 1024)
				for {
					n, err := os.Stdin.Read(buf)
					if n > 0 && conn.Write(ctx, websocket.MessageBinary, buf[:n]) != nil {
						return
					}
					if err != nil {
						return
					}
				}
			}()
		}
		for {
			_, msg, err := conn.Read(ctx)
			if err != nil {
				return
			}
			out.Write(msg)
		}
	})
	return u
}

func (u *upConsole) stop() {
	u.cancel()
	u.wg.Wait()
}

// stop ends the vmm (which destroys its instance) and then the
// downstairs, within 10 s in all.
func (s *upSession) stop() {
	if s.vmm != nil {
		s.vmm.stop(upVMMGrace)
	}
	var wg sync.WaitGroup
	for _, d := range s.downstairs {
		wg.Go(func() { d.stop(upDownstairsGrace) })
	}
	wg.Wait()
}

// childVMM is the vmm as a child process of tern up.
type childVMM struct{ c *upChild }

func (v childVMM) done() <-chan struct{}    { return v.c.exited }
func (v childVMM) stop(grace time.Duration) { v.c.stop(grace) }
func (v childVMM) describe() string         { return fmt.Sprintf("%v", v.c.proc.Err()) }
