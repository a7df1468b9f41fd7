package kvmhost

import (
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Environment variables that steer the kernel cache.
const (
	// CacheEnv names the cache directory (default: tern-kvmhost under
	// os.UserCacheDir()).
	CacheEnv = "TERN_KVMHOST_CACHE"
	// KernelEnv names the Debian kernel package to boot instead of the one
	// linux-image-amd64 depends on (e.g. linux-image-6.1.0-57-amd64).
	KernelEnv = "TERN_KVMHOST_KERNEL"
)

// metaPackage is Debian's package that depends on the current kernel.
const metaPackage = "linux-image-amd64"

// hostModules are the modules the emulated host loads, with their
// dependencies read from modinfo: KVM, the driver of the network card
// Options.Network adds (cheap to load when there is none), TAP and the
// bridge, which the VMM's network cards and their tests use, and veth,
// VXLAN, the clsact qdisc and tc's BPF classifier, which the data plane's
// test hosts, its tunnel and its tc-filter attachment need.
var hostModules = []string{"kvm", "kvm_amd", "e1000", "tun", "bridge", "veth", "vxlan", "sch_ingress", "cls_bpf"}

// Kernel is a Debian kernel unpacked into the cache: the uncompressed ELF
// vmlinux and an initramfs fragment with the KVM modules.
type Kernel struct {
	// Package is the Debian package, e.g. linux-image-6.1.0-57-amd64.
	Package string `json:"package"`
	// Release is the kernel release, e.g. 6.1.0-57-amd64.
	Release string `json:"release"`
	// Modules are the module names in load order.
	Modules []string `json:"modules"`
	// Dir is the kernel's cache directory (not stored).
	Dir string `json:"-"`
}

// Vmlinux is the path of the uncompressed ELF kernel, which QEMU boots
// through its PVH entry.
func (k *Kernel) Vmlinux() string { return filepath.Join(k.Dir, "vmlinux") }

// ModulesCPIO is the path of the cpio archive holding the modules under
// /kvmhost/modules and their load order.
func (k *Kernel) ModulesCPIO() string { return filepath.Join(k.Dir, "modules.cpio") }

const kernelMetaFile = "kernel.json"

// CacheDir returns the kernel cache directory.
func CacheDir() (string, error) {
	if d := os.Getenv(CacheEnv); d != "" {
		return filepath.Abs(d)
	}
	d, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("finding the cache directory (set %s): %w", CacheEnv, err)
	}
	return filepath.Join(d, "tern-kvmhost"), nil
}

// errAptListsMissing reports that apt knows no packages yet.
var errAptListsMissing = errors.New("apt's package lists are missing")

// KernelPackage names the kernel package to boot: $TERN_KVMHOST_KERNEL, or
// what `apt-cache depends linux-image-amd64` names. When the package lists
// are missing it runs `apt-get update` as root, and otherwise says what to
// run.
func KernelPackage(ctx context.Context) (string, error) {
	if p := os.Getenv(KernelEnv); p != "" {
		return p, nil
	}
	pkg, err := dependsOf(ctx)
	if errors.Is(err, errAptListsMissing) && geteuid() == 0 {
		if out, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return "", fmt.Errorf("running apt-get update: %v: %s", uerr, lastLine(out))
		}
		pkg, err = dependsOf(ctx)
	}
	if errors.Is(err, errAptListsMissing) {
		return "", fmt.Errorf("naming the kernel package: %w: run `sudo apt-get update` (or set %s to a linux-image package)", err, KernelEnv)
	}
	return pkg, err
}

// dependsOf asks apt-cache which linux-image package linux-image-amd64
// depends on.
func dependsOf(ctx context.Context) (string, error) {
	if _, err := exec.LookPath("apt-cache"); err != nil {
		return "", fmt.Errorf("naming the kernel package: apt-cache not found (a Debian host is needed, or set %s and %s to a filled cache)", KernelEnv, CacheEnv)
	}
	out, err := exec.CommandContext(ctx, "apt-cache", "depends", metaPackage).CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(dep, "linux-image-") {
			return strings.TrimSpace(dep), nil
		}
	}
	if err != nil || bytes.Contains(out, []byte("No packages found")) || len(bytes.TrimSpace(out)) == 0 {
		return "", errAptListsMissing
	}
	return "", fmt.Errorf("naming the kernel package: apt-cache depends %s named no linux-image package: %s", metaPackage, lastLine(out))
}

// CachedKernel returns the cached kernel of package pkg, or false.
func CachedKernel(cache, pkg string) (*Kernel, bool) {
	dir := filepath.Join(cache, pkg)
	b, err := os.ReadFile(filepath.Join(dir, kernelMetaFile))
	if err != nil {
		return nil, false
	}
	var k Kernel
	if json.Unmarshal(b, &k) != nil || k.Package != pkg {
		return nil, false
	}
	k.Dir = dir
	if !isRegular(k.Vmlinux()) || !isRegular(k.ModulesCPIO()) {
		return nil, false
	}
	for _, m := range hostModules {
		if !slices.Contains(k.Modules, m) {
			return nil, false // cached before m was needed: fetch again
		}
	}
	return &k, true
}

// EnsureKernel returns the cached kernel, fetching and unpacking it first
// when it is not cached. Progress goes to log. Concurrent callers (test
// binaries of several packages) serialise on a lock file in the cache.
func EnsureKernel(ctx context.Context, log io.Writer) (*Kernel, error) {
	cache, err := CacheDir()
	if err != nil {
		return nil, err
	}
	pkg, err := KernelPackage(ctx)
	if err != nil {
		return nil, err
	}
	if k, ok := CachedKernel(cache, pkg); ok {
		return k, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return nil, fmt.Errorf("creating kernel cache: %w", err)
	}
	lock, err := os.OpenFile(filepath.Join(cache, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("locking kernel cache: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("locking kernel cache: %w", err)
	}
	if k, ok := CachedKernel(cache, pkg); ok { // another process filled it
		return k, nil
	}
	start := time.Now()
	k, err := fetchKernel(ctx, cache, pkg)
	if err != nil && os.Getenv(KernelEnv) == "" && geteuid() == 0 && ctx.Err() == nil {
		// Stale package lists name a kernel the mirror no longer has:
		// update them once and try the package they name now.
		if out, uerr := exec.CommandContext(ctx, "apt-get", "update", "-qq").CombinedOutput(); uerr != nil {
			return nil, fmt.Errorf("%w (and apt-get update failed: %s)", err, lastLine(out))
		}
		if pkg, err = KernelPackage(ctx); err != nil {
			return nil, err
		}
		if cached, ok := CachedKernel(cache, pkg); ok {
			return cached, nil
		}
		k, err = fetchKernel(ctx, cache, pkg)
	}
	if err == nil {
		// Said after the fact, so that a failure stays one line.
		fmt.Fprintf(log, "kvmhost: fetched %s into %s in %.1fs (once)\n", pkg, cache, time.Since(start).Seconds())
	}
	return k, err
}

// fetchKernel downloads pkg with apt-get, unpacks it with dpkg-deb in a
// scratch directory, extracts vmlinux and the modules, and keeps only those.
func fetchKernel(ctx context.Context, cache, pkg string) (*Kernel, error) {
	scratch, err := os.MkdirTemp(cache, "fetch-")
	if err != nil {
		return nil, fmt.Errorf("fetching kernel: %w", err)
	}
	defer os.RemoveAll(scratch)
	root, vmlinuz, err := unpackPackage(ctx, scratch, pkg)
	if err != nil {
		return nil, err
	}
	release := strings.TrimPrefix(filepath.Base(vmlinuz), "vmlinuz-")
	dir := filepath.Join(cache, pkg)
	tmpDir := dir + ".tmp"
	os.RemoveAll(tmpDir)
	if err := os.MkdirAll(tmpDir, 0o755); err != nil {
		return nil, fmt.Errorf("unpacking kernel %s: %w", pkg, err)
	}
	defer os.RemoveAll(tmpDir)
	bz, err := os.ReadFile(vmlinuz)
	if err != nil {
		return nil, fmt.Errorf("reading kernel image: %w", err)
	}
	vmlinux, err := ExtractVmlinux(ctx, bz)
	if err != nil {
		return nil, fmt.Errorf("extracting vmlinux from %s: %w", filepath.Base(vmlinuz), err)
	}
	if err := os.WriteFile(filepath.Join(tmpDir, "vmlinux"), vmlinux, 0o644); err != nil {
		return nil, fmt.Errorf("writing vmlinux: %w", err)
	}
	if err := os.WriteFile(filepath.Join(tmpDir, "vmlinuz"), bz, 0o644); err != nil {
		return nil, fmt.Errorf("writing vmlinuz: %w", err)
	}
	order, err := writeModulesCPIO(ctx, filepath.Join(root, "lib", "modules", release), filepath.Join(tmpDir, "modules.cpio"))
	if err != nil {
		return nil, fmt.Errorf("collecting KVM modules of %s: %w", release, err)
	}
	k := &Kernel{Package: pkg, Release: release, Modules: order}
	meta, _ := json.MarshalIndent(k, "", "  ")
	if err := os.WriteFile(filepath.Join(tmpDir, kernelMetaFile), meta, 0o644); err != nil {
		return nil, fmt.Errorf("writing kernel metadata: %w", err)
	}
	os.RemoveAll(dir)
	if err := os.Rename(tmpDir, dir); err != nil {
		return nil, fmt.Errorf("storing kernel in cache: %w", err)
	}
	k.Dir = dir
	return k, nil
}

// unpackPackage downloads pkg with apt-get into scratch, unpacks it there
// with dpkg-deb, and returns the unpacked root and its boot/vmlinuz-*.
func unpackPackage(ctx context.Context, scratch, pkg string) (root, vmlinuz string, err error) {
	root, err = FetchPackages(ctx, scratch, pkg)
	if err != nil {
		return "", "", fmt.Errorf("fetching the kernel: %w", err) // err names pkg
	}
	vmlinuz, err = KernelImageIn(root)
	if err != nil {
		return "", "", fmt.Errorf("unpacking kernel %s: %w", pkg, err)
	}
	return root, vmlinuz, nil
}

// KernelImageIn returns the path of the one boot/vmlinuz-* under root (a
// kernel package unpacked by FetchPackages); its name after "vmlinuz-"
// is the kernel release.
func KernelImageIn(root string) (string, error) {
	vmlinuzes, _ := filepath.Glob(filepath.Join(root, "boot", "vmlinuz-*"))
	if len(vmlinuzes) != 1 {
		return "", fmt.Errorf("want one boot/vmlinuz-*, found %d", len(vmlinuzes))
	}
	return vmlinuzes[0], nil
}

// FetchPackages downloads the Debian packages pkgs with `apt-get download`
// into scratch and unpacks each with `dpkg-deb -x` into scratch/root,
// which it returns. Nothing is installed: no maintainer script runs and
// the host's package database is untouched.
func FetchPackages(ctx context.Context, scratch string, pkgs ...string) (string, error) {
	// apt-get drops privileges to _apt for the download when it can
	// write to the directory as that user.
	os.Chmod(scratch, 0o777)
	dl := exec.CommandContext(ctx, "apt-get", append([]string{"download", "-q"}, pkgs...)...)
	dl.Dir = scratch
	if out, err := dl.CombinedOutput(); err != nil {
		return "", fmt.Errorf("downloading %s: apt-get download: %s", strings.Join(pkgs, " "), lastLine(out))
	}
	debs, _ := filepath.Glob(filepath.Join(scratch, "*.deb"))
	if len(debs) != len(pkgs) {
		return "", fmt.Errorf("downloading %s: apt-get download left %d .deb files, want %d", strings.Join(pkgs, " "), len(debs), len(pkgs))
	}
	root := filepath.Join(scratch, "root")
	for _, deb := range debs {
		if out, err := exec.CommandContext(ctx, "dpkg-deb", "-x", deb, root).CombinedOutput(); err != nil {
			return "", fmt.Errorf("unpacking %s: dpkg-deb -x: %v: %s", filepath.Base(deb), err, lastLine(out))
		}
	}
	return root, nil
}

// Vmlinuz is the path of the package's compressed bzImage, which
// EnsureBzImage keeps beside vmlinux for boot loaders that take one
// (vmm/boot.LoadLinux). CachedKernel does not require it.
func (k *Kernel) Vmlinuz() string { return filepath.Join(k.Dir, "vmlinuz") }

// EnsureBzImage returns the path of the cached kernel's bzImage (the same
// package the emulated host boots), fetching the kernel first when it is
// not cached, and the package once more when the cache predates keeping
// the bzImage. The cached vmlinux and modules are left as they are.
func EnsureBzImage(ctx context.Context, log io.Writer) (string, error) {
	k, err := EnsureKernel(ctx, log)
	if err != nil {
		return "", err
	}
	if isRegular(k.Vmlinuz()) {
		return k.Vmlinuz(), nil
	}
	lock, err := os.OpenFile(filepath.Join(filepath.Dir(k.Dir), ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("locking kernel cache: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking kernel cache: %w", err)
	}
	if isRegular(k.Vmlinuz()) { // another process fetched it
		return k.Vmlinuz(), nil
	}
	start := time.Now()
	scratch, err := os.MkdirTemp(filepath.Dir(k.Dir), "fetch-")
	if err != nil {
		return "", fmt.Errorf("fetching kernel bzImage: %w", err)
	}
	defer os.RemoveAll(scratch)
	_, vmlinuz, err := unpackPackage(ctx, scratch, k.Package)
	if err != nil {
		return "", err
	}
	bz, err := os.ReadFile(vmlinuz)
	if err != nil {
		return "", fmt.Errorf("reading kernel image: %w", err)
	}
	tmp := k.Vmlinuz() + ".tmp"
	if err := os.WriteFile(tmp, bz, 0o644); err != nil {
		return "", fmt.Errorf("writing vmlinuz: %w", err)
	}
	if err := os.Rename(tmp, k.Vmlinuz()); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("storing vmlinuz in cache: %w", err)
	}
	fmt.Fprintf(log, "kvmhost: fetched %s's bzImage into %s in %.1fs (once)\n", k.Package, k.Dir, time.Since(start).Seconds())
	return k.Vmlinuz(), nil
}

// ExtractVmlinux returns the ELF kernel inside a bzImage: the setup header
// gives the payload's offset (from the protected-mode code, which follows
// the setup sectors) and length; the payload is XZ (Debian's), zstd or
// gzip compressed.
func ExtractVmlinux(ctx context.Context, bz []byte) ([]byte, error) {
	if len(bz) < 0x250 || binary.LittleEndian.Uint32(bz[0x202:]) != 0x53726448 { // "HdrS"
		return nil, errors.New("not a bzImage (no HdrS setup header)")
	}
	setupSects := int(bz[0x1f1])
	if setupSects == 0 {
		setupSects = 4
	}
	off := (setupSects+1)*512 + int(binary.LittleEndian.Uint32(bz[0x248:]))
	n := int(binary.LittleEndian.Uint32(bz[0x24c:]))
	if off < 0 || n <= 0 || off+n > len(bz) {
		return nil, fmt.Errorf("payload [%d, %d) outside the %d-byte image", off, off+n, len(bz))
	}
	payload := bz[off : off+n]
	var out []byte
	var err error
	switch {
	case bytes.HasPrefix(payload, []byte("\xfd7zXZ\x00")):
		// The build appends the uncompressed size after the stream.
		out, err = decompressWith(ctx, payload, "xz", "-dc", "--single-stream")
	case bytes.HasPrefix(payload, []byte("\x28\xb5\x2f\xfd")):
		out, err = decompressWith(ctx, payload, "zstd", "-dcq")
	case bytes.HasPrefix(payload, []byte("\x1f\x8b")):
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(bytes.NewReader(payload)); err == nil {
			zr.Multistream(false)
			out, err = io.ReadAll(zr)
		}
	default:
		return nil, fmt.Errorf("payload compression %x not supported (want xz, zstd or gzip)", payload[:min(6, len(payload))])
	}
	if !bytes.HasPrefix(out, []byte("\x7fELF")) {
		if err == nil {
			err = errors.New("decompressed payload is not ELF")
		}
		return nil, err
	}
	return out, nil // zstd may complain about the appended size; the ELF is whole
}

// decompressWith pipes data through an external decompressor.
func decompressWith(ctx context.Context, data []byte, tool string, args ...string) ([]byte, error) {
	if _, err := exec.LookPath(tool); err != nil {
		return nil, fmt.Errorf("decompressing: %s not found (install %s)", tool, map[string]string{"xz": "xz-utils", "zstd": "zstd"}[tool])
	}
	cmd := exec.CommandContext(ctx, tool, args...)
	cmd.Stdin = bytes.NewReader(data)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("decompressing with %s: %v: %s", tool, err, lastLine(stderr.Bytes()))
	}
	return out, nil
}

// moduleName normalises a module name as the kernel does ('-' is '_').
func moduleName(s string) string { return strings.ReplaceAll(s, "-", "_") }

// writeModulesCPIO finds hostModules and their dependencies under modDir,
// writes them uncompressed to a cpio archive at dst under /kvmhost/modules
// with a load-order file, and returns the order.
func writeModulesCPIO(ctx context.Context, modDir, dst string) ([]string, error) {
	mods, err := ModuleClosure(ctx, modDir, hostModules)
	if err != nil {
		return nil, err
	}
	f, err := os.Create(dst)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	w := newCPIOWriter(f)
	var order []string
	for _, m := range mods {
		w.File(modulesDir+"/"+m.Name+".ko", 0o644, int64(len(m.Data)), bytes.NewReader(m.Data))
		order = append(order, m.Name)
	}
	list := strings.Join(order, "\n") + "\n"
	w.File(modulesOrderFile, 0o644, int64(len(list)), strings.NewReader(list))
	if err := w.Close(); err != nil {
		return nil, err
	}
	return order, f.Close()
}

// Module is one kernel module, uncompressed.
type Module struct {
	// Name is the module's name as the kernel spells it ('_', not '-').
	Name string
	// Data is the uncompressed .ko file.
	Data []byte
}

// ModuleClosure returns the modules names and everything they depend on
// (each module's depends= modinfo field, transitively), found under
// modDir (a kernel package's lib/modules/RELEASE, which ships no
// modules.dep) and decompressed, in load order: every module after the
// modules it depends on, each once, dependencies in name order so that
// the order is the same on every run. A module missing from the package
// or a dependency cycle is an error naming it.
func ModuleClosure(ctx context.Context, modDir string, names []string) ([]Module, error) {
	files := map[string]string{}
	err := filepath.WalkDir(modDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		base := d.Name()
		if i := strings.Index(base, ".ko"); i > 0 && !d.IsDir() {
			files[moduleName(base[:i])] = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing modules: %w", err)
	}
	var order []Module
	state := map[string]int{} // 1 visiting, 2 done
	var visit func(name, parent string) error
	visit = func(name, parent string) error {
		switch state[name] {
		case 1:
			return fmt.Errorf("module %s depends on itself through %s", name, parent)
		case 2:
			return nil
		}
		state[name] = 1
		p, ok := files[name]
		if !ok && parent == "" {
			return fmt.Errorf("module %s not in the package", name)
		}
		if !ok {
			return fmt.Errorf("module %s (needed by %s) not in the package", name, parent)
		}
		b, err := readModule(ctx, p)
		if err != nil {
			return err
		}
		deps, err := moduleDepends(b)
		if err != nil {
			return fmt.Errorf("reading modinfo of %s: %w", name, err)
		}
		for _, d := range deps {
			if err := visit(d, name); err != nil {
				return err
			}
		}
		state[name] = 2
		order = append(order, Module{Name: name, Data: b})
		return nil
	}
	for _, m := range names {
		if err := visit(moduleName(m), ""); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// Where the initramfs keeps the modules.
const (
	modulesDir       = "/kvmhost/modules"
	modulesOrderFile = "/kvmhost/modules/order"
)

// readModule reads a module file, decompressing .ko.xz, .ko.zst and
// .ko.gz.
func readModule(ctx context.Context, p string) ([]byte, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	switch {
	case strings.HasSuffix(p, ".ko"):
		return b, nil
	case strings.HasSuffix(p, ".ko.xz"):
		return decompressWith(ctx, b, "xz", "-dc")
	case strings.HasSuffix(p, ".ko.zst"):
		return decompressWith(ctx, b, "zstd", "-dcq")
	case strings.HasSuffix(p, ".ko.gz"):
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("decompressing %s: %w", p, err)
		}
		return io.ReadAll(zr)
	}
	return nil, fmt.Errorf("module %s: unknown compression", p)
}

// moduleDepends returns the depends= field of a module's .modinfo section.
func moduleDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, err
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, errors.New("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	var deps []string
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			for _, d := range strings.Split(string(v), ",") {
				if d = strings.TrimSpace(d); d != "" {
					deps = append(deps, moduleName(d))
				}
			}
		}
	}
	sort.Strings(deps)
	return deps, nil
}

// lastLine returns the last non-empty line of out, for one-line errors.
func lastLine(out []byte) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

// geteuid is os.Geteuid, replaced by tests of the non-root paths.
var geteuid = os.Geteuid
