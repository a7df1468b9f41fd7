package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"tern/cmd/internal/serve"

	"github.com/spf13/cobra"
)

// Commands whose layer tern does not link run in a sibling binary:
// `tern control` in tern-control (it embeds etcd, gRPC and protobuf) and
// `tern agent` and `tern bench dataplane` in tern-agent (the eBPF loader
// and netlink). Go runs the initialisers of every package a binary links,
// so a vmm, downstairs or CLI process that must not pay for those layers
// cannot share a binary with them (docs/ARCHITECTURE.md, "Processes").

// siblingCommand is a tern command that replaces this process (exec: the
// same pid, arguments and environment, so a caller that signals or waits
// on it sees no difference) with the sibling binary name, passing tern's
// own arguments on. envVar names an override of the binary's path.
func siblingCommand(use, short, long, name, envVar string, argv func(args []string) []string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Long: long + `

Runs the ` + name + ` binary: $` + envVar + `, else the one beside tern, else
` + name + ` on PATH, else one built (once, into the user cache) from the
source tree tern was built from.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			bin, err := siblingBinary(name, envVar, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			full := append([]string{bin}, argv(args)...)
			// The root's --log-level is parsed by tern, not passed in args.
			if logLevel != "" {
				full = append(full, "--log-level", logLevel)
			}
			env := os.Environ()
			if self, err := os.Executable(); err == nil {
				env = append(env, serve.TernBinaryEnv+"="+self)
			}
			if err := syscall.Exec(bin, full, env); err != nil {
				return fmt.Errorf("running %s: %w", bin, err)
			}
			return nil
		},
	}
}

// siblingBinary finds the sibling binary name, or builds it.
func siblingBinary(name, envVar string, progress io.Writer) (string, error) {
	if p := os.Getenv(envVar); p != "" {
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return buildSibling(name, envVar, progress)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// buildSibling builds cmd/NAME from the source tree this binary was built
// from (what `go run ./cmd/tern` and a bare `go build ./cmd/tern` leave:
// no sibling beside tern) into the user cache, holding a lock so that
// processes started together build once. go build leaves an up-to-date
// binary alone, so later starts only check.
func buildSibling(name, envVar string, progress io.Writer) (string, error) {
	hint := "build it beside tern (go build -o DIR/ ./cmd/...) or set " + envVar
	root := sourceTree()
	if root == "" {
		return "", errors.New("this command needs the " + name + " binary, and tern's source tree is not here to build it: " + hint)
	}
	if _, err := exec.LookPath("go"); err != nil {
		return "", errors.New("this command needs the " + name + " binary, and there is no go command to build it from " + root + ": " + hint)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "tern")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s for %s: %w", dir, name, err)
	}
	out := filepath.Join(dir, name)
	lock, err := os.OpenFile(out+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", fmt.Errorf("locking %s: %w", out, err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", fmt.Errorf("locking %s: %w", out, err)
	}
	defer syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
	if _, err := os.Stat(out); err != nil {
		fmt.Fprintf(progress, "tern: no %s beside tern or on PATH; building it from %s into %s\n", name, root, out)
	}
	build := exec.Command("go", "build", "-o", out, "./cmd/"+name)
	build.Dir = root
	if msg, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s from %s: %v\n%s", name, root, err, msg)
	}
	return out, nil
}

// sourceTree is the root of tern's source tree to build a sibling from:
// the one this binary was built from (its file paths, unless built with
// -trimpath), else the working directory or one above it; "" when
// neither holds tern's go.mod.
func sourceTree() string {
	_, file, _, _ := runtime.Caller(0)
	wd, _ := os.Getwd()
	return findSourceTree(file, wd)
}

// findSourceTree is sourceTree given this file's recorded path and the
// working directory.
func findSourceTree(file, wd string) string {
	isTern := func(dir string) bool {
		mod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		return err == nil && strings.HasPrefix(string(mod), "module tern\n")
	}
	if filepath.IsAbs(file) {
		if root := filepath.Dir(filepath.Dir(filepath.Dir(file))); isTern(root) {
			return root
		}
	}
	for dir := wd; dir != "" && filepath.IsAbs(dir); {
		if isTern(dir) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	return ""
}
