package kvmhost

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// guestEnv is the binary's environment inside: the given one, with TMPDIR
// pointing at the guest's tmpfs and InsideEnv set.
func guestEnv(env []string) []string {
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if k == "TMPDIR" || k == InsideEnv || k == InitEnv {
			continue
		}
		out = append(out, kv)
	}
	return append(out, "TMPDIR=/tmp", InsideEnv+"=1")
}

// buildInitramfs writes the cached modules archive followed by a second
// cpio archive (the kernel unpacks concatenated archives in order) holding
// /init, the binary, every shared library either needs, the extra files,
// the working directory's testdata and the run spec.
func buildInitramfs(dst string, k *Kernel, binary string, o Options) error {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("creating initramfs: %w", err)
	}
	defer f.Close()
	base, err := os.Open(k.ModulesCPIO())
	if err != nil {
		return fmt.Errorf("reading cached modules: %w", err)
	}
	_, err = io.Copy(f, base)
	base.Close()
	if err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	r := &runArchive{w: newCPIOWriter(bw), added: map[string]bool{}, libs: newLibResolver()}
	if err := r.addRun(binary, o); err != nil {
		return err
	}
	if err := r.w.Close(); err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("writing initramfs: %w", err)
	}
	return f.Close()
}

// runArchive is the per-run cpio archive being written.
type runArchive struct {
	w     *cpioWriter
	added map[string]bool // guest paths already written
	libs  *libResolver
}

// add carries host path host in at guest, once per guest path.
func (r *runArchive) add(host, guest string) error {
	if r.added[guest] {
		return nil
	}
	r.added[guest] = true
	return addHostPath(r.w, host, guest)
}

// addWithLibraries carries an executable in at its host path, with what
// it needs to run (its dynamic loader and libraries, or its interpreter).
func (r *runArchive) addWithLibraries(host, guest string) error {
	if err := r.add(host, guest); err != nil {
		return err
	}
	deps, err := r.libs.Dependencies(host)
	if err != nil {
		return err
	}
	for _, d := range deps {
		if err := r.add(d, d); err != nil {
			return err
		}
	}
	return nil
}

// addRun writes /init (a link to the binary when this executable is the
// binary), the binary, the extra files, the working directory (with its
// testdata) and the run spec.
func (r *runArchive) addRun(binary string, o Options) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding own executable for /init: %w", err)
	}
	self, _ = filepath.EvalSymlinks(self)
	resolved, _ := filepath.EvalSymlinks(binary)
	if self == resolved {
		r.w.Symlink("/init", binary)
	} else {
		if err := r.addWithLibraries(self, initExePath); err != nil {
			return err
		}
		r.w.Symlink("/init", initExePath)
	}
	if err := r.addWithLibraries(binary, binary); err != nil {
		return err
	}
	for _, file := range o.Files {
		guest := file.Guest
		if guest == "" {
			abs, err := filepath.Abs(file.Host)
			if err != nil {
				return fmt.Errorf("carrying %s: %w", file.Host, err)
			}
			guest = abs
		}
		add := r.add
		if st, err := os.Stat(file.Host); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			add = r.addWithLibraries // a carried tern binary needs its libraries too
		}
		if err := add(file.Host, guest); err != nil {
			return err
		}
	}
	r.w.Dir(o.Dir)
	if td := filepath.Join(o.Dir, "testdata"); isDir(td) {
		if err := r.add(td, td); err != nil {
			return err
		}
	}
	spec, _ := json.Marshal(runSpec{
		Path:    binary,
		Argv:    append([]string{o.Binary}, o.Args...),
		Env:     guestEnv(o.Env),
		Dir:     o.Dir,
		Network: o.Network != nil,
	})
	r.w.File(runSpecPath, 0o644, int64(len(spec)), bytes.NewReader(spec))
	return r.w.err
}

func isDir(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.IsDir()
}

// addHostPath adds host file or directory tree host at guest, following
// symbolic links.
func addHostPath(w *cpioWriter, host, guest string) error {
	st, err := os.Stat(host)
	if err != nil {
		return fmt.Errorf("carrying %s: %w", host, errors.Unwrap(err))
	}
	if st.IsDir() {
		w.Dir(guest)
		entries, err := os.ReadDir(host)
		if err != nil {
			return fmt.Errorf("carrying %s: %w", host, err)
		}
		for _, e := range entries {
			if err := addHostPath(w, filepath.Join(host, e.Name()), filepath.Join(guest, e.Name())); err != nil {
				return err
			}
		}
		return nil
	}
	if !st.Mode().IsRegular() {
		return nil // sockets, devices: nothing to carry
	}
	f, err := os.Open(host)
	if err != nil {
		return fmt.Errorf("carrying %s: %w", host, err)
	}
	defer f.Close()
	w.File(guest, uint32(st.Mode().Perm()), st.Size(), f)
	return w.err
}
