package kvmhost

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// libDirs are the directories searched for a shared library after its
// binary's run paths and ldconfig's cache, in the dynamic loader's order
// on Debian's x86-64 multiarch layout.
var libDirs = []string{
	"/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu",
	"/lib64", "/usr/lib64", "/lib", "/usr/lib",
}

// libResolver finds the shared libraries an ELF binary needs, recursively:
// on the host, or inside an unpacked root file system (a tree of Debian
// packages unpacked with dpkg-deb), where paths are the guest's and
// symbolic links resolve inside the root.
type libResolver struct {
	root    string            // "" for the host
	ldcache map[string]string // soname -> path, from `ldconfig -p` (host only)
}

func newLibResolver() *libResolver {
	return &libResolver{ldcache: readLdconfigCache()}
}

// LibrariesIn returns the guest paths of the dynamic loader and every
// shared library (DT_NEEDED, recursively) that the ELF file at guest path
// bin needs, resolved inside the directory root as the loader would
// resolve them in a system whose / is root: run paths, then Debian's
// library directories (no ld.so.cache). Each path is where the loader
// looks; HostPathIn gives the file behind it. A static binary needs none.
func LibrariesIn(root, bin string) ([]string, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("resolving libraries in %s: %w", root, err)
	}
	r := &libResolver{root: abs, ldcache: map[string]string{}}
	return r.Dependencies(path.Clean("/" + bin))
}

// HostPathIn returns the file that guest path p names inside root,
// following symbolic links as the guest would: an absolute target is
// taken from root, and ".." never climbs above it.
func HostPathIn(root, p string) (string, error) {
	const maxLinks = 40
	links := 0
	rest := strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/")
	cur := "/" // resolved guest directory so far
	for len(rest) > 0 {
		name := rest[0]
		rest = rest[1:]
		if name == "" || name == "." {
			continue
		}
		next := path.Join(cur, name) // Join cleans "..", never above "/"
		st, err := os.Lstat(filepath.Join(root, next))
		if err != nil || st.Mode()&os.ModeSymlink == 0 {
			cur = next // a missing component is reported by the caller's open
			continue
		}
		if links++; links > maxLinks {
			return "", fmt.Errorf("resolving %s in %s: too many symbolic links", p, root)
		}
		target, err := os.Readlink(filepath.Join(root, next))
		if err != nil {
			return "", fmt.Errorf("resolving %s in %s: %w", p, root, err)
		}
		if path.IsAbs(target) {
			cur = "/"
		}
		rest = append(strings.Split(strings.Trim(target, "/"), "/"), rest...)
	}
	return filepath.Join(root, cur), nil
}

// host returns the file behind path p: p itself on the host, else p
// resolved inside the root.
func (r *libResolver) host(p string) string {
	if r.root == "" {
		return p
	}
	h, err := HostPathIn(r.root, p)
	if err != nil {
		return filepath.Join(r.root, p) // fails to open, naming p
	}
	return h
}

// regular reports whether path p is (or links to) a regular file.
func (r *libResolver) regular(p string) bool { return isRegular(r.host(p)) }

// readLdconfigCache returns the x86-64 entries of `ldconfig -p`, or an
// empty map when ldconfig is not there.
func readLdconfigCache() map[string]string {
	m := map[string]string{}
	bin, err := exec.LookPath("ldconfig")
	if err != nil {
		bin = "/sbin/ldconfig"
	}
	out, err := exec.Command(bin, "-p").Output()
	if err != nil {
		return m
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		// "	libc.so.6 (libc6,x86-64) => /lib/x86_64-linux-gnu/libc.so.6"
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, " (")
		if !ok {
			continue
		}
		flags, p, ok := strings.Cut(rest, ") => ")
		if !ok || !strings.Contains(flags, "x86-64") {
			continue
		}
		if _, seen := m[name]; !seen {
			m[name] = p
		}
	}
	return m
}

// Dependencies returns the absolute paths of the dynamic loader (PT_INTERP)
// and every shared library (DT_NEEDED, recursively) that the ELF file at
// bin needs, each once, in discovery order. For a "#!" script they are its
// interpreter and what that needs. A static binary needs none.
func (r *libResolver) Dependencies(bin string) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	queue := []string{bin}
	for len(queue) > 0 {
		file := queue[0]
		queue = queue[1:]
		if file == bin && !isELF(r.host(bin)) {
			interp, ok := r.scriptInterpreter(bin)
			if !ok {
				return nil, nil // neither ELF nor a script: nothing to resolve
			}
			seen[interp] = true
			out = append(out, interp)
			queue = append(queue, interp)
			continue
		}
		f, err := elf.Open(r.host(file))
		if err != nil {
			return nil, fmt.Errorf("reading ELF %s: %w", file, err)
		}
		interp, needed, runpaths, err := elfDynamicInfo(f)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("reading ELF %s: %w", file, err)
		}
		if interp != "" && !seen[interp] {
			seen[interp] = true
			out = append(out, interp)
		}
		for _, lib := range needed {
			p, err := r.find(lib, file, runpaths)
			if err != nil {
				return nil, err
			}
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
				queue = append(queue, p)
			}
		}
	}
	return out, nil
}

// elfDynamicInfo reads PT_INTERP, DT_NEEDED and DT_RUNPATH/DT_RPATH.
func elfDynamicInfo(f *elf.File) (interp string, needed, runpaths []string, err error) {
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		b := make([]byte, p.Filesz)
		if _, err := p.ReadAt(b, 0); err != nil {
			return "", nil, nil, fmt.Errorf("reading PT_INTERP: %w", err)
		}
		interp = string(bytes.TrimRight(b, "\x00"))
	}
	if f.Section(".dynamic") == nil {
		return interp, nil, nil, nil
	}
	needed, err = f.ImportedLibraries()
	if err != nil {
		return "", nil, nil, fmt.Errorf("reading DT_NEEDED: %w", err)
	}
	for _, tag := range []elf.DynTag{elf.DT_RUNPATH, elf.DT_RPATH} {
		vals, err := f.DynString(tag)
		if err != nil {
			continue
		}
		for _, v := range vals {
			runpaths = append(runpaths, filepath.SplitList(v)...)
		}
	}
	return interp, needed, runpaths, nil
}

// find resolves soname lib needed by file.
func (r *libResolver) find(lib, file string, runpaths []string) (string, error) {
	if strings.Contains(lib, "/") {
		if r.root != "" {
			return path.Join(path.Dir(file), lib), nil
		}
		return filepath.Abs(lib)
	}
	var dirs []string
	for _, rp := range runpaths {
		dirs = append(dirs, strings.ReplaceAll(rp, "$ORIGIN", filepath.Dir(file)))
	}
	for _, d := range dirs {
		if p := filepath.Join(d, lib); r.regular(p) {
			return p, nil
		}
	}
	if p, ok := r.ldcache[lib]; ok && r.regular(p) {
		return p, nil
	}
	for _, d := range libDirs {
		if p := filepath.Join(d, lib); r.regular(p) {
			return p, nil
		}
	}
	where := "ldconfig's cache or " + strings.Join(libDirs, ", ")
	if r.root != "" {
		where = strings.Join(libDirs, ", ") + " under " + r.root
	}
	return "", fmt.Errorf("finding shared library %s needed by %s: not in its run path, %s", lib, file, where)
}

// isRegular reports whether p is (or links to) a regular file.
func isRegular(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}

// scriptInterpreter returns the absolute interpreter path of a "#!" script.
func (r *libResolver) scriptInterpreter(p string) (string, bool) {
	f, err := os.Open(r.host(p))
	if err != nil {
		return "", false
	}
	defer f.Close()
	line, _ := bufio.NewReader(io.LimitReader(f, 256)).ReadString('\n')
	rest, ok := strings.CutPrefix(line, "#!")
	if !ok {
		return "", false
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 || !filepath.IsAbs(fields[0]) || !r.regular(fields[0]) {
		return "", false
	}
	return fields[0], true
}

// isELF reports whether the file at p starts with the ELF magic.
func isELF(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	var magic [4]byte
	_, err = io.ReadFull(f, magic[:])
	return err == nil && string(magic[:]) == elf.ELFMAG
}
