package linuxguest

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"

	"tern/internal/kvmhost"
)

// Where the initramfs keeps the modules: ModulesDir(release)/NAME.ko and
// the load order, one name a line, in ModulesDir(release)/order.
func ModulesDir(release string) string { return "/lib/modules/" + release }

// busyboxPath is where busybox-static installs busybox, and the target of
// every applet link.
const busyboxPath = "/bin/busybox"

// writeInitramfsFile writes the initramfs to dst.
func writeInitramfsFile(ctx context.Context, dst, root, release string, mods []kvmhost.Module) error {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	defer f.Close()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err := writeInitramfs(ctx, bw, root, release, mods); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	return f.Close()
}

// archive is an initramfs being written from an unpacked root.
type archive struct {
	w     *kvmhost.CPIO
	root  string
	added map[string]bool // guest paths written
}

// writeInitramfs writes the userland's cpio archive to w, taking every
// file but /init from root (the unpacked packages).
func writeInitramfs(ctx context.Context, w io.Writer, root, release string, mods []kvmhost.Module) error {
	a := &archive{w: kvmhost.NewCPIO(w), root: root, added: map[string]bool{}}
	for _, d := range []string{"/dev", "/proc", "/sys", "/tmp", "/root", "/mnt", "/etc"} {
		a.w.Dir(d)
	}
	// The kernel opens /dev/console for init before anything is mounted.
	a.w.CharDev("/dev/console", 0o600, 5, 1)
	a.w.File("/init", 0o755, int64(len(initScript)), bytes.NewReader(initScript))
	a.added["/init"] = true

	if err := a.program(busyboxPath); err != nil {
		return err
	}
	for _, p := range programs {
		if err := a.program(p); err != nil {
			return err
		}
	}
	for _, p := range configFiles {
		if err := a.carry(p); err != nil {
			return err
		}
	}
	applets, err := busyboxApplets(ctx, filepath.Join(root, busyboxPath))
	if err != nil {
		return err
	}
	for _, p := range applets {
		if !a.added[p] { // e2fsprogs' own programs win over busybox's
			a.added[p] = true
			a.w.Symlink(p, busyboxPath)
		}
	}
	dir := ModulesDir(release)
	var order strings.Builder
	for _, m := range mods {
		a.w.File(dir+"/"+m.Name+".ko", 0o644, int64(len(m.Data)), bytes.NewReader(m.Data))
		fmt.Fprintln(&order, m.Name)
	}
	a.w.File(dir+"/order", 0o644, int64(order.Len()), strings.NewReader(order.String()))
	if err := a.w.Close(); err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	return nil
}

// program carries the executable at guest path p and, when it is
// dynamically linked, its loader and shared libraries, resolved inside
// the root.
func (a *archive) program(p string) error {
	if err := a.carry(p); err != nil {
		return err
	}
	libs, err := kvmhost.LibrariesIn(a.root, p)
	if err != nil {
		return fmt.Errorf("carrying %s: %w", p, err)
	}
	for _, l := range libs {
		if err := a.carry(l); err != nil {
			return err
		}
	}
	return nil
}

// carry writes guest path p as the root has it: a regular file with its
// permissions, or a symbolic link (kept as a link) together with what it
// points at. The directories leading to p are taken as real directories.
func (a *archive) carry(p string) error {
	p = path.Clean("/" + p)
	if a.added[p] {
		return nil
	}
	a.added[p] = true
	host := filepath.Join(a.root, p)
	st, err := os.Lstat(host)
	if err != nil {
		// A parent in the root may be a link (lib -> usr/lib): take
		// the file it leads to.
		if host, err = kvmhost.HostPathIn(a.root, p); err == nil {
			st, err = os.Lstat(host)
		}
		if err != nil {
			return fmt.Errorf("carrying %s: not in the unpacked packages", p)
		}
	}
	switch {
	case st.Mode()&os.ModeSymlink != 0:
		target, err := os.Readlink(host)
		if err != nil {
			return fmt.Errorf("carrying %s: %w", p, err)
		}
		a.w.Symlink(p, target)
		if !path.IsAbs(target) {
			target = path.Join(path.Dir(p), target)
		}
		return a.carry(target)
	case st.Mode().IsRegular():
		f, err := os.Open(host)
		if err != nil {
			return fmt.Errorf("carrying %s: %w", p, err)
		}
		defer f.Close()
		a.w.File(p, uint32(st.Mode().Perm()), st.Size(), f)
		return nil
	}
	return fmt.Errorf("carrying %s: neither a file nor a symbolic link (%v)", p, st.Mode().Type())
}

// busyboxApplets returns the guest paths of busybox's applets, as the
// static busybox at host path bin lists them (--list-full). The binary is
// Debian's busybox-static: it runs on any x86-64 Linux host.
func busyboxApplets(ctx context.Context, bin string) ([]string, error) {
	if f, err := elf.Open(bin); err != nil {
		return nil, fmt.Errorf("listing busybox applets: %w", err)
	} else {
		static := true
		for _, p := range f.Progs {
			static = static && p.Type != elf.PT_INTERP
		}
		f.Close()
		if !static {
			return nil, fmt.Errorf("listing busybox applets: %s is not static", bin)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, "--list-full").Output()
	if err != nil {
		return nil, fmt.Errorf("listing busybox applets: %s --list-full: %w", bin, err)
	}
	var applets []string
	for _, l := range strings.Split(string(out), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			applets = append(applets, path.Clean("/"+l))
		}
	}
	if len(applets) < 10 {
		return nil, fmt.Errorf("listing busybox applets: %s --list-full named %d", bin, len(applets))
	}
	return applets, nil
}
