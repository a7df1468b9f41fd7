package kvmhost

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// IsInit reports whether this process is the emulated host's init: pid 1
// with InitEnv set by the kernel command line Exec gives.
func IsInit() bool { return os.Getpid() == 1 && os.Getenv(InitEnv) == "1" }

// RunInit is the emulated host's /init. It never returns: it mounts the
// file systems, brings up loopback, loads the KVM modules, checks
// /dev/kvm, runs the binary of the run spec with its stdout and stderr on
// their serial ports, reports the exit status on the console and powers
// off.
func RunInit() {
	console, err := os.OpenFile(consoleTTY, os.O_WRONLY|unix.O_NOCTTY, 0)
	if err != nil {
		console = os.Stderr // the kernel's /dev/console, if any
	}
	status, err := initAndRun(console)
	if err != nil {
		fmt.Fprintf(console, "\n%s%s\n", errorPrefix, strings.ReplaceAll(err.Error(), "\n", " "))
	} else {
		fmt.Fprintf(console, "\n%s%d\n", statusPrefix, status)
	}
	drain(console)
	unix.Sync()
	for {
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
}

// initAndRun does init's work and returns the binary's exit status.
func initAndRun(console io.Writer) (int, error) {
	for _, m := range []struct{ fstype, dir string }{
		{"proc", "/proc"}, {"sysfs", "/sys"}, {"devtmpfs", "/dev"},
	} {
		if err := os.MkdirAll(m.dir, 0o755); err != nil {
			return 0, fmt.Errorf("creating %s: %w", m.dir, err)
		}
		if err := unix.Mount(m.fstype, m.dir, m.fstype, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return 0, fmt.Errorf("mounting %s on %s: %w", m.fstype, m.dir, err)
		}
	}
	if err := mountTmp(); err != nil {
		return 0, err
	}
	if err := loopbackUp(); err != nil {
		return 0, err
	}
	if err := raiseOpenFileLimit(); err != nil {
		return 0, err
	}
	if err := loadModules(); err != nil {
		return 0, err
	}
	if fd, err := unix.Open("/dev/kvm", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
		return 0, fmt.Errorf("opening /dev/kvm after loading the modules: %w", err)
	} else {
		unix.Close(fd)
	}
	b, err := os.ReadFile(runSpecPath)
	if err != nil {
		return 0, fmt.Errorf("reading run spec: %w", err)
	}
	var spec runSpec
	if err := json.Unmarshal(b, &spec); err != nil {
		return 0, fmt.Errorf("decoding run spec: %w", err)
	}
	if spec.Network {
		if err := networkUp(); err != nil {
			return 0, err
		}
	}
	fmt.Fprintf(console, "\n%s\n", startedLine)
	go heartbeat(console)
	return runBinary(spec)
}

// heartbeat prints a numbered line on the console every heartbeatEvery,
// for ever: the host takes its absence for a hung machine.
func heartbeat(console io.Writer) {
	for n := 1; ; n++ {
		time.Sleep(heartbeatEvery)
		fmt.Fprintf(console, "\n%s%d\n", heartbeatPrefix, n)
	}
}

// raiseOpenFileLimit lifts init's open-file limit, which every process
// in the emulated host inherits, from the kernel's default for init (1024
// soft, 4096 hard) to the kernel's ceiling (fs.nr_open): a test with three
// regions of a few thousand extents each holds more files than that,
// as it may on the host (Go lifts a soft limit to the hard one, not past).
func raiseOpenFileLimit() error {
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		return fmt.Errorf("reading fs.nr_open: %w", err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return fmt.Errorf("parsing fs.nr_open %q: %w", b, err)
	}
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: n, Max: n}); err != nil {
		return fmt.Errorf("raising the open-file limit to %d: %w", n, err)
	}
	return nil
}

// loopbackUp sets IFF_UP on lo.
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up lo: reading flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP | unix.IFF_RUNNING)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("bringing up lo: %w", err)
	}
	return nil
}

// loadModules loads the modules in the order the kernel cache recorded.
func loadModules() error {
	b, err := os.ReadFile(modulesOrderFile)
	if err != nil {
		return fmt.Errorf("reading module order: %w", err)
	}
	for _, name := range strings.Fields(string(b)) {
		f, err := os.Open(modulesDir + "/" + name + ".ko")
		if err != nil {
			return fmt.Errorf("loading module %s: %w", name, err)
		}
		err = unix.FinitModule(int(f.Fd()), "", 0)
		f.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("loading module %s: %w", name, err)
		}
	}
	return nil
}

// runBinary runs the spec's binary with stdout and stderr on their serial
// ports and returns its exit status (128+signal when killed by one).
func runBinary(spec runSpec) (int, error) {
	stdout, err := openRawTTY(stdoutTTY)
	if err != nil {
		return 0, err
	}
	defer stdout.Close()
	stderr, err := openRawTTY(stderrTTY)
	if err != nil {
		return 0, err
	}
	defer stderr.Close()
	if err := os.MkdirAll(spec.Dir, 0o755); err != nil {
		return 0, fmt.Errorf("creating working directory: %w", err)
	}
	cmd := &exec.Cmd{Path: spec.Path, Args: spec.Argv, Env: spec.Env, Dir: spec.Dir, Stdout: stdout, Stderr: stderr}
	err = cmd.Run()
	drain(stdout)
	drain(stderr)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal()), nil
		}
		return ee.ExitCode(), nil
	}
	if err != nil {
		return 0, fmt.Errorf("starting %s: %w", spec.Path, err)
	}
	return 0, nil
}

// openRawTTY opens a serial port for writing with output processing off,
// so that bytes pass unchanged ("\n" stays "\n").
func openRawTTY(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	t, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("reading termios of %s: %w", path, err)
	}
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Iflag &^= unix.ICRNL | unix.IXON
	if err := unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, t); err != nil {
		f.Close()
		return nil, fmt.Errorf("setting termios of %s: %w", path, err)
	}
	return f, nil
}

// drain waits until everything written to a tty has been sent (tcdrain).
func drain(f *os.File) {
	unix.IoctlSetInt(int(f.Fd()), unix.TCSBRK, 1)
}

// mountTmp mounts a tmpfs on /tmp. What the initramfs put under /tmp (a
// test binary built in the host's /tmp, its working directory) would be
// hidden by it, so it is copied into the new tmpfs first, which then
// moves onto /tmp.
func mountTmp() error {
	const staging = "/kvmhost/tmp"
	if err := os.MkdirAll(staging, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", staging, err)
	}
	if err := unix.Mount("tmpfs", staging, "tmpfs", 0, "mode=1777"); err != nil {
		return fmt.Errorf("mounting tmpfs: %w", err)
	}
	if err := os.MkdirAll("/tmp", 0o1777); err != nil {
		return fmt.Errorf("creating /tmp: %w", err)
	}
	if err := copyTree("/tmp", staging); err != nil {
		return fmt.Errorf("moving /tmp into its tmpfs: %w", err)
	}
	entries, _ := os.ReadDir("/tmp")
	for _, e := range entries {
		os.RemoveAll("/tmp/" + e.Name()) // frees the initramfs copy
	}
	if err := unix.Mount(staging, "/tmp", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("moving tmpfs onto /tmp: %w", err)
	}
	return nil
}

// copyTree copies the contents of directory src into existing directory
// dst: directories, regular files (with their permission bits) and
// symbolic links.
func copyTree(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		s, d := src+"/"+e.Name(), dst+"/"+e.Name()
		info, err := os.Lstat(s)
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			if err := os.Mkdir(d, info.Mode().Perm()); err != nil {
				return err
			}
			if err := copyTree(s, d); err != nil {
				return err
			}
		case info.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(s)
			if err != nil {
				return err
			}
			if err := os.Symlink(target, d); err != nil {
				return err
			}
		case info.Mode().IsRegular():
			if err := copyFile(s, d, info.Mode().Perm()); err != nil {
				return err
			}
		}
	}
	return nil
}

func copyFile(src, dst string, perm os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
