package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

func init() { rootCmd.AddCommand(newControlCmd()) }

// controlBinaryEnv names a tern-control binary for tern control to run,
// ahead of the one beside tern or on PATH.
const controlBinaryEnv = "TERN_CONTROL_BIN"

// newControlCmd is tern control: it replaces this process with the
// tern-control binary (cmd/tern-control), same pid, arguments and
// environment, so a caller that signals or waits on tern control's pid
// sees no difference. The control plane is a binary of its own because
// it embeds etcd: linked into tern, etcd's server and client, gRPC and
// protobuf ran some 250 package initialisers in every vmm, downstairs and
// CLI process and tripled their memory (docs/ARCHITECTURE.md).
func newControlCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "control --listen ADDR --data-dir DIR --certs DIR [--etcd-endpoints URLS]",
		Short: "Run the control plane: records in etcd, placement, migration sagas, drain",
		Long: `Serve the control-plane API on --listen (tern control --help lists the
flags). Runs the tern-control binary: $` + controlBinaryEnv + `, else the one
beside tern, else tern-control on PATH, else one built (once, into the
user cache) from the source tree tern was built from.`,
		DisableFlagParsing: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			bin, err := controlBinary(cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			// The root's --log-level is not parsed here: it reaches
			// tern-control among args.
			argv := append([]string{bin}, args...)
			if logLevel != "" {
				argv = append(argv, "--log-level", logLevel)
			}
			if err := syscall.Exec(bin, argv, os.Environ()); err != nil {
				return fmt.Errorf("running %s: %w", bin, err)
			}
			return nil
		},
	}
}

// controlBinary finds the tern-control binary to run, or builds it.
func controlBinary(progress interface{ Write([]byte) (int, error) }) (string, error) {
	if p := os.Getenv(controlBinaryEnv); p != "" {
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "tern-control")
		if isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("tern-control"); err == nil {
		return p, nil
	}
	return buildControlBinary(progress)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// buildControlBinary builds cmd/tern-control from the source tree this
// binary was built from (what `go run ./cmd/tern` and a bare `go build
// ./cmd/tern` leave: no tern-control beside tern) into the user cache,
// holding a lock so that control processes started together build once.
// go build leaves an up-to-date binary alone, so later starts only check.
func buildControlBinary(progress interface{ Write([]byte) (int, error) }) (string, error) {
	const hint = "build it beside tern (go build -o DIR ./cmd/tern ./cmd/tern-control) or set " + controlBinaryEnv
	_, file, _, ok := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(file)))
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if !ok || !filepath.IsAbs(file) || err != nil || !strings.HasPrefix(string(mod), "module tern\n") {
		return "", errors.New("tern control needs the tern-control binary, and tern's source tree is not here to build it: " + hint)
	}
	if _, err := exec.LookPath("go"); err != nil {
		return "", errors.New("tern control needs the tern-control binary, and there is no go command to build it from " + root + ": " + hint)
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "tern")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s for tern-control: %w", dir, err)
	}
	out := filepath.Join(dir, "tern-control")
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
		fmt.Fprintf(progress, "tern control: no tern-control beside tern or on PATH; building it from %s into %s\n", root, out)
	}
	build := exec.Command("go", "build", "-o", out, "./cmd/tern-control")
	build.Dir = root
	if msg, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building tern-control from %s: %v\n%s", root, err, msg)
	}
	return out, nil
}
