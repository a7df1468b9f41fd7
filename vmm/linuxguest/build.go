package linuxguest

import (
	"bufio"
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"tern/internal/kvmhost"
)

// What the userland prints on the console, and the command line to boot
// it with.
const (
	// ReadyLine is printed once the modules are loaded, just before the
	// shell starts.
	ReadyLine = "tern-linux: ready"
	// Prompt is the shell's prompt (PS1).
	Prompt = "tern-linux# "
	// ModuleFailedPrefix starts the line that names a module insmod
	// could not load.
	ModuleFailedPrefix = "tern-linux: module failed: "
	// Cmdline is the kernel command line for tern: the console on ttyS0,
	// reboot at once on a panic, no check of the PIT's interrupt through
	// an IOAPIC (vmm/linux_platform.go) and a quiet boot.
	Cmdline = "console=ttyS0 panic=-1 no_timer_check quiet"
)

// CacheEnv names the cache directory DefaultCacheDir returns.
const CacheEnv = "TERN_LINUXGUEST_CACHE"

// initScript is /init.
//
//go:embed init.sh
var initScript []byte

// Modules are the kernel modules the userland loads, with everything they
// depend on (kvmhost.ModuleClosure). crc32c_generic is named because ext4
// asks for its checksum through the crypto API, which no depends= field
// records.
var Modules = []string{"virtio_mmio", "virtio_blk", "virtio_net", "ext4", "crc32c_generic"}

// rootPackages are the Debian packages the userland is made of, besides
// the kernel; the libraries come from their dependency closure.
var rootPackages = []string{"busybox-static", "e2fsprogs"}

// programs are e2fsprogs' programs carried into the initramfs, each with
// the shared libraries it needs; a symbolic link brings its target.
var programs = []string{
	"/sbin/mke2fs", "/sbin/mkfs.ext4", "/sbin/mkfs.ext3", "/sbin/mkfs.ext2",
	"/sbin/e2fsck", "/sbin/fsck.ext4", "/sbin/tune2fs", "/sbin/resize2fs",
	"/sbin/dumpe2fs", "/sbin/debugfs", "/sbin/e2label",
	"/usr/bin/chattr", "/usr/bin/lsattr", "/usr/sbin/filefrag",
}

// configFiles are carried as the packages ship them.
var configFiles = []string{"/etc/mke2fs.conf"}

// recipeVersion changes when what Build makes changes in a way the inputs
// hashed into the cache key (the script, the lists above) do not show.
const recipeVersion = "1"

// Files is a built userland.
type Files struct {
	// Kernel is Debian's bzImage (boot/vmlinuz-RELEASE of the package).
	Kernel string `json:"-"`
	// Initramfs is an uncompressed newc cpio archive.
	Initramfs string `json:"-"`
	// KernelPackage is the Debian kernel package, e.g.
	// linux-image-6.1.0-57-amd64; Release its kernel release.
	KernelPackage string `json:"kernel_package"`
	Release       string `json:"release"`
	// Packages are the Debian packages the initramfs was taken from.
	Packages []string `json:"packages"`
	// Modules are the modules /init loads, in that order.
	Modules []string `json:"modules"`
}

const filesMeta = "files.json"

// DefaultCacheDir returns $TERN_LINUXGUEST_CACHE, or tern-linuxguest
// under the user's cache directory.
func DefaultCacheDir() (string, error) {
	if d := os.Getenv(CacheEnv); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding the cache directory (set %s): %w", CacheEnv, err)
	}
	return filepath.Join(d, "tern-linuxguest"), nil
}

// Build returns the kernel and initramfs of the userland for the kernel
// package the emulated host boots (kvmhost.KernelPackage), assembling
// them in cacheDir first when they are not there: the packages are
// downloaded with apt-get and unpacked with dpkg-deb in a scratch
// directory that is removed afterwards. Progress goes to log.
func Build(ctx context.Context, cacheDir string, log io.Writer) (Files, error) {
	pkg, err := kvmhost.KernelPackage(ctx)
	if err != nil {
		return Files{}, err
	}
	dir := filepath.Join(cacheDir, pkg+"-"+recipeKey())
	if f, ok := cached(dir); ok {
		return f, nil
	}
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return Files{}, fmt.Errorf("creating userland cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cacheDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return Files{}, fmt.Errorf("locking userland cache: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return Files{}, fmt.Errorf("locking userland cache: %w", err)
	}
	if f, ok := cached(dir); ok { // another process built it
		return f, nil
	}
	start := time.Now()
	f, err := build(ctx, cacheDir, dir, pkg)
	if err != nil {
		return Files{}, err
	}
	fmt.Fprintf(log, "linuxguest: built the Linux userland (%s, %d packages) into %s in %.1fs (once)\n",
		pkg, len(f.Packages), dir, time.Since(start).Seconds())
	return f, nil
}

// recipeKey is a short hash of what decides the userland's content
// besides the kernel package.
func recipeKey() string {
	h := sha256.New()
	for _, part := range [][]string{{recipeVersion, string(initScript)}, Modules, rootPackages, programs, configFiles} {
		for _, s := range part {
			fmt.Fprintf(h, "%d:%s;", len(s), s)
		}
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:12]
}

// cached returns the userland stored in dir, or false.
func cached(dir string) (Files, bool) {
	b, err := os.ReadFile(filepath.Join(dir, filesMeta))
	if err != nil {
		return Files{}, false
	}
	var f Files
	if json.Unmarshal(b, &f) != nil || f.Release == "" {
		return Files{}, false
	}
	f.Kernel, f.Initramfs = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs")
	for _, p := range []string{f.Kernel, f.Initramfs} {
		if st, err := os.Stat(p); err != nil || !st.Mode().IsRegular() {
			return Files{}, false
		}
	}
	return f, true
}

// build fetches the packages and writes the userland into dir.
func build(ctx context.Context, cacheDir, dir, kernelPkg string) (Files, error) {
	pkgs, err := packageClosure(ctx, rootPackages)
	if err != nil {
		return Files{}, err
	}
	scratch, err := os.MkdirTemp(cacheDir, "build-")
	if err != nil {
		return Files{}, fmt.Errorf("building userland: %w", err)
	}
	defer os.RemoveAll(scratch)
	root, err := kvmhost.FetchPackages(ctx, scratch, append([]string{kernelPkg}, pkgs...)...)
	if err != nil {
		return Files{}, fmt.Errorf("building userland: %w", err)
	}
	vmlinuz, err := kvmhost.KernelImageIn(root)
	if err != nil {
		return Files{}, fmt.Errorf("unpacking kernel %s: %w", kernelPkg, err)
	}
	release := strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")
	mods, err := kvmhost.ModuleClosure(ctx, filepath.Join(root, "lib", "modules", release), Modules)
	if err != nil {
		return Files{}, fmt.Errorf("collecting modules of %s: %w", release, err)
	}
	tmp := dir + ".tmp"
	os.RemoveAll(tmp)
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return Files{}, fmt.Errorf("building userland: %w", err)
	}
	defer os.RemoveAll(tmp)
	if err := copyFile(vmlinuz, filepath.Join(tmp, "vmlinuz")); err != nil {
		return Files{}, fmt.Errorf("storing kernel image: %w", err)
	}
	if err := writeInitramfsFile(ctx, filepath.Join(tmp, "initramfs"), root, release, mods); err != nil {
		return Files{}, err
	}
	f := Files{KernelPackage: kernelPkg, Release: release, Packages: pkgs}
	for _, m := range mods {
		f.Modules = append(f.Modules, m.Name)
	}
	meta, _ := json.MarshalIndent(f, "", "  ")
	if err := os.WriteFile(filepath.Join(tmp, filesMeta), meta, 0o644); err != nil {
		return Files{}, fmt.Errorf("writing userland metadata: %w", err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return Files{}, fmt.Errorf("storing userland in cache: %w", err)
	}
	f.Kernel, f.Initramfs = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs")
	return f, nil
}

// packageClosure returns roots and every package they depend on
// (Depends and Pre-Depends, recursively, as apt-cache resolves them),
// sorted, without virtual packages.
func packageClosure(ctx context.Context, roots []string) ([]string, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return nil, fmt.Errorf("resolving the userland's packages: apt-cache not found (a Debian host is needed)")
	}
	args := append([]string{"depends", "--recurse", "--no-recommends", "--no-suggests",
		"--no-conflicts", "--no-breaks", "--no-replaces", "--no-enhances"}, roots...)
	out, err := exec.CommandContext(ctx, "apt-cache", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("resolving the userland's packages: apt-cache depends: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return parseDependsClosure(out, roots)
}

// parseDependsClosure reads the package names of `apt-cache depends
// --recurse` output: the unindented lines, of which "<name>" ones are
// virtual packages (provided by a real one listed too). Every root must be
// among them.
func parseDependsClosure(out []byte, roots []string) ([]string, error) {
	var pkgs []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == ' ' || line[0] == '\t' || strings.HasPrefix(line, "<") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 1 || strings.ContainsAny(fields[0], ":<>") {
			continue // a message, not a package
		}
		name := fields[0]
		if !slices.Contains(pkgs, name) {
			pkgs = append(pkgs, name)
		}
	}
	for _, r := range roots {
		if !slices.Contains(pkgs, r) {
			return nil, fmt.Errorf("resolving the userland's packages: apt-cache knows no package %s (run apt-get update?)", r)
		}
	}
	slices.Sort(pkgs)
	return pkgs, nil
}

// WriteTo copies the kernel and the initramfs into dir (created if
// missing) as vmlinuz and initramfs, replacing any there, and returns
// their paths.
func (f Files) WriteTo(dir string) (kernel, initrd string, err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("creating %s: %w", dir, err)
	}
	kernel, initrd = filepath.Join(dir, "vmlinuz"), filepath.Join(dir, "initramfs")
	for _, c := range [][2]string{{f.Kernel, kernel}, {f.Initramfs, initrd}} {
		if err := copyFile(c[0], c[1]); err != nil {
			return "", "", fmt.Errorf("writing %s: %w", c[1], err)
		}
	}
	return kernel, initrd, nil
}

// copyFile copies src to dst, replacing it.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
