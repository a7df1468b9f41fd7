// Package build compiles tern's test guests from C and assembly into
// reproducible ELF files. It is shared by the go:generate command and by
// the test that checks the committed ELF files are what the sources build.
package build

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Guests lists the guests built from src/<name>.c, in output order.
var Guests = []string{"hello", "dirty", "disk", "echo", "demo", "udp", "smp"}

// CompilerFile is the name, in the output directory, of the file that
// records the first line of `cc --version` the ELF files were built with:
// the bytes are reproducible for one compiler version, not across versions.
const CompilerFile = "COMPILER"

// commonSources are linked into every guest.
var commonSources = []string{"entry.S", "runtime.c", "trap.c"}

// entrySources replaces commonSources' entry.S for the guests that
// assemble it with more: smp_entry.S is entry.S with SMP_GUEST defined.
var entrySources = map[string]string{"smp": "smp_entry.S"}

// sharedSources are the shared drivers each guest links beside
// commonSources and its own <name>.c: only the guests that use a driver
// carry it (and its buffers).
var sharedSources = map[string][]string{
	"disk": {"virtio_blk.c"},
	"echo": {"line.c"},
	"demo": {"virtio_blk.c", "line.c"},
	"udp":  {"virtio_net.c"},
}

// Flags are the compiler and linker flags. They leave out everything that
// would make the bytes depend on the checkout or the host: no debug info,
// source paths mapped, no build id, no ident string, symbols stripped.
var Flags = []string{
	"-std=gnu11", "-O2", "-g0", "-Wall", "-Werror",
	"-ffreestanding", "-nostdlib", "-static", "-fno-pic", "-fno-pie", "-no-pie",
	"-mgeneral-regs-only", "-mno-red-zone", "-fno-stack-protector",
	"-fno-asynchronous-unwind-tables", "-fno-unwind-tables", "-fno-ident",
	"-fno-builtin", "-Wl,--build-id=none", "-Wl,-T,link.ld",
	"-Wl,-z,max-page-size=4096", "-Wl,-z,noexecstack", "-Wl,--no-warn-rwx-segments", "-s",
}

// ErrNoCompiler reports that no C compiler named cc is on PATH.
var ErrNoCompiler = errors.New("no C compiler (cc) on PATH")

// CompilerVersion returns the first line of `cc --version`.
func CompilerVersion(ctx context.Context) (string, error) {
	if _, err := exec.LookPath("cc"); err != nil {
		return "", ErrNoCompiler
	}
	out, err := exec.CommandContext(ctx, "cc", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("running cc --version: %w", err)
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line), nil
}

// Build compiles every guest from srcDir into outDir/<name>.elf and writes
// outDir/COMPILER.
func Build(ctx context.Context, srcDir, outDir string) error {
	version, err := CompilerVersion(ctx)
	if err != nil {
		return err
	}
	absSrc, err := filepath.Abs(srcDir)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", srcDir, err)
	}
	absOut, err := filepath.Abs(outDir)
	if err != nil {
		return fmt.Errorf("resolving %s: %w", outDir, err)
	}
	if err := os.MkdirAll(absOut, 0o755); err != nil {
		return fmt.Errorf("creating output directory: %w", err)
	}
	for _, name := range Guests {
		args := append([]string{}, Flags...)
		args = append(args, "-ffile-prefix-map="+absSrc+"=vmm/guests/src")
		for _, src := range commonSources {
			if e, ok := entrySources[name]; ok && src == "entry.S" {
				src = e
			}
			args = append(args, src)
		}
		args = append(args, sharedSources[name]...)
		args = append(args, name+".c", "-o", filepath.Join(absOut, name+".elf"))
		cmd := exec.CommandContext(ctx, "cc", args...)
		cmd.Dir = absSrc
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("compiling guest %s: %w\n%s", name, err, stderr.String())
		}
	}
	if err := os.WriteFile(filepath.Join(absOut, CompilerFile), []byte(version+"\n"), 0o644); err != nil {
		return fmt.Errorf("writing compiler version: %w", err)
	}
	return nil
}
