package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"tern/cmd/internal/serve"
	"tern/internal/blockio"
	"tern/internal/units"
	"tern/vmm"
	"tern/vmm/devices"
)

func init() { rootCmd.AddCommand(newVMMCmd()) }

func newVMMCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "vmm",
		Short: "Run virtual machines on KVM",
	}
	cmd.AddCommand(newVMMRunCmd())
	return cmd
}

// vmmRunFlags are the flags of tern vmm run.
type vmmRunFlags struct {
	guest   string
	memory  units.Bytes
	vcpus   int
	disk    string
	timeout time.Duration
	// nets are the --net values: tap:NAME[,mac=MAC], one card each.
	nets []string
	// kernel, initrd and cmdline boot a Linux bzImage instead of --guest.
	kernel, initrd, cmdline string
	volume                  volumeFlags // --certs and --gen of a volume disk
}

// defaultGuestMemory is --memory's default.
const defaultGuestMemory = 128 << 20

func newVMMRunCmd() *cobra.Command {
	f := &vmmRunFlags{memory: defaultGuestMemory}
	cmd := &cobra.Command{
		Use:   "run --guest FILE|NAME [--memory 128MiB] [--vcpus N] [--disk file:PATH | --disk volume:A,B,C --certs DIR --gen N] [--net tap:NAME[,mac=MAC]]... [--timeout D]",
		Short: "Boot a guest in the foreground",
		Long: `Boot a guest in the foreground: its serial console on stdout (and stdin
forwarded to it), tern's logs on stderr, and the status the guest writes to
port 0xf4 as the exit status. A guest that triple-faults, or one still
running when --timeout expires, ends the command with a message and a
non-zero status.

--guest is a built-in test guest (hello, dirty, disk, echo) or an ELF file.
--kernel boots a Linux kernel instead (a bzImage, or an uncompressed ELF
vmlinux, which skips the decompressor), with --initrd and --cmdline (its
console is ttyS0). A Linux guest's --disk is /dev/vda once its initramfs
loads the virtio_mmio and virtio_blk modules: the kernel finds the disk in
the ACPI tables, and it interrupts through the in-kernel irqchip. The
guest's poweroff or reboot (through the ACPI registers tern's tables name)
ends the command with status 0; it does not boot the guest again.

--net tap:NAME gives the guest a virtio-net card on the host's TAP
interface NAME (created, down, if there is none; put it up and on a bridge
with ip(8)); repeat it for more cards, up to 4. Its MAC is
52:54:00 and three bytes derived from NAME unless given with
tap:NAME,mac=MAC. The card offers no offloads; a Linux guest's card is
eth0 once its initramfs loads virtio_net.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runVM(cmd, f) },
	}
	fs := cmd.Flags()
	fs.StringVar(&f.guest, "guest", "", "built-in guest name or ELF file")
	fs.Var(&f.memory, "memory", "guest RAM")
	fs.IntVar(&f.vcpus, "vcpus", 1, "number of vCPUs")
	fs.StringVar(&f.disk, "disk", "", "virtio-blk disk: file:PATH, or volume:A,B,C (three downstairs; K+M shards with --layout ec:K+M)")
	fs.StringVar(&f.volume.certs, "certs", "", "certificate directory, for a volume disk")
	fs.Uint64Var(&f.volume.gen, "gen", 0, "activation generation, for a volume disk")
	registerLayout(fs, &f.volume.layout)
	fs.StringArrayVar(&f.nets, "net", nil, netFlagHelp)
	fs.DurationVar(&f.timeout, "timeout", 0, "stop the guest after this long (0: never)")
	fs.StringVar(&f.kernel, "kernel", "", "Linux bzImage or ELF vmlinux to boot instead of --guest")
	fs.StringVar(&f.initrd, "initrd", "", "initramfs for --kernel")
	fs.StringVar(&f.cmdline, "cmdline", "console=ttyS0 panic=-1", "kernel command line for --kernel")
	cmd.MarkFlagsMutuallyExclusive("guest", "kernel")
	cmd.MarkFlagsOneRequired("guest", "kernel")
	return cmd
}

// runVM is tern vmm run.
func runVM(cmd *cobra.Command, f *vmmRunFlags) error {
	log, err := newLogger(serve.ClientLogLevel)
	if err != nil {
		return err
	}
	ctx := cmd.Context()
	nics, err := parseNetFlags(f.nets)
	if err != nil {
		return err
	}
	disk, closeDisk, err := openDisk(ctx, f, log)
	if err != nil {
		return err
	}
	defer closeDisk()
	cfg := vmm.Config{Guest: f.guest, MemoryBytes: uint64(f.memory), VCPUs: f.vcpus, NICs: nics, Logger: log}
	name := f.guest
	if f.kernel != "" {
		name = f.kernel
		cfg.Linux = &vmm.LinuxGuest{Kernel: f.kernel, Initrd: f.initrd, Cmdline: f.cmdline}
	} else if f.initrd != "" || cmd.Flags().Changed("cmdline") {
		return errors.New("--initrd and --cmdline are for --kernel only")
	}
	if disk != nil {
		cfg.Disk = disk
	}
	vm, err := vmm.New(cfg)
	if err != nil {
		return err
	}
	defer vm.Close()

	out := newSerialCopier(vm.Serial().Output(), cmd.OutOrStdout())
	go forwardInput(cmd.InOrStdin(), vm.Serial(), log)
	runCtx := ctx
	if f.timeout > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithTimeoutCause(ctx, f.timeout, errTimeout)
		defer cancel()
	}
	log.Info("booting guest", "guest", name, "memory", f.memory.String(), "vcpus", max(f.vcpus, 1), "disk", f.disk, "nets", f.nets)
	status, err := vm.Run(runCtx)
	out.stop()
	if up, ok := vm.BootTimer().Elapsed(); ok {
		log.Info("guest wrote the boot-timer magic", "after", up.String())
	}
	if err == nil {
		log.Info("guest exited", "status", status)
	}
	switch {
	case errors.Is(err, vmm.ErrPoweredOff):
		log.Info("guest powered off")
		return nil
	case errors.Is(err, vmm.ErrGuestReset):
		// As Firecracker does: the process's VM ends; a supervisor (or the
		// instance API, which boots a fresh VM) restarts it.
		log.Info("guest rebooted; tern vmm run ends (the instance API reboots in place)")
		return nil
	case errors.Is(err, errTimeout):
		return fmt.Errorf("guest %s still running after --timeout %v; stopped it", name, f.timeout)
	case err != nil && ctx.Err() != nil:
		return fmt.Errorf("guest %s: interrupted", name)
	case err != nil:
		return fmt.Errorf("running guest %s: %w", name, err)
	case status != 0:
		code := int(status & 0xff)
		if code == 0 {
			code = 1
		}
		return &exitError{code: code, err: fmt.Errorf("guest %s exited with status %d", name, status)}
	}
	return nil
}

// errTimeout is the cause of --timeout's context.
var errTimeout = errors.New("--timeout expired")

// openDisk opens --disk's backend; the returned close frees it.
func openDisk(ctx context.Context, f *vmmRunFlags, log *slog.Logger) (blockio.Device, func(), error) {
	kind, arg, _ := strings.Cut(f.disk, ":")
	if kind != "volume" && (f.volume.certs != "" || f.volume.gen != 0) {
		return nil, nil, fmt.Errorf("--certs and --gen are for --disk volume:A,B,C only")
	}
	switch {
	case f.disk == "":
		return nil, func() {}, nil
	case kind == "file" && arg != "":
		b, err := devices.OpenFileBackend(arg, 512)
		if err != nil {
			return nil, nil, err
		}
		return b, func() { b.Close() }, nil
	case kind == "volume" && arg != "":
		return openVolumeDisk(ctx, f, strings.Split(arg, ","), log)
	}
	return nil, nil, fmt.Errorf("--disk %q: want file:PATH or volume:A,B,C", f.disk)
}

// forwardInput copies r (the command's stdin) to the guest's UART until
// EOF or a read error. It is owned by the process: a terminal's read
// cannot be interrupted, so it ends with the command at the latest.
func forwardInput(r io.Reader, uart *devices.UART, log *slog.Logger) {
	buf := make([]byte, 4096)
	for {
		n, err := r.Read(buf)
		if n > 0 {
			if got := uart.Input(buf[:n]); got < n {
				log.Warn("guest serial input full; input dropped", "bytes", n-got)
			}
		}
		if err != nil {
			return
		}
	}
}
