// Command kvmhost runs a binary inside the emulated KVM test host (a
// Debian kernel under QEMU TCG with an emulated AMD-V CPU), or checks
// whether /dev/kvm or the emulated host can be used here.
//
//	kvmhost exec [--timeout D] [--file HOST[:GUEST]]... BINARY [ARGS...]
//	kvmhost check
//
// The same executable is the emulated host's /init: it copies itself into
// the initramfs and, started there as pid 1, acts as init.
//
// exec exits with the binary's status; 124 when the time limit killed
// QEMU; 125 when kvmhost itself failed (one line on stderr says why).
// Under `go run`, cmd/go turns any non-zero status into 1 and prints
// "exit status N": build the command when the exact status matters.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"tern/internal/kvmhost"
)

func main() {
	if kvmhost.IsInit() {
		kvmhost.RunInit() // never returns
	}
	os.Exit(run(os.Args[1:]))
}

const usage = `usage:
  kvmhost exec [--timeout D] [--file HOST_PATH[:GUEST_PATH]]... BINARY [ARGS...]
  kvmhost check
`

func run(args []string) int {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	switch args[0] {
	case "exec":
		return execCmd(args[1:])
	case "check":
		if !kvmhost.Check(context.Background()) {
			fmt.Fprintln(os.Stderr, "kvmhost: neither /dev/kvm nor the emulated host is usable here")
			return 1
		}
		return 0
	case "-h", "--help", "help":
		fmt.Print(usage)
		return 0
	}
	fmt.Fprintf(os.Stderr, "kvmhost: unknown command %q\n%s", args[0], usage)
	return 2
}

func execCmd(args []string) int {
	fs := flag.NewFlagSet("kvmhost exec", flag.ContinueOnError)
	var o kvmhost.Options
	fs.DurationVar(&o.Timeout, "timeout", 0, "wall-clock limit, after which QEMU is killed (default $"+kvmhost.TimeoutEnv+" or "+kvmhost.DefaultTimeout.String()+")")
	fs.Func("file", "carry HOST_PATH[:GUEST_PATH] into the emulated host (repeatable)", func(s string) error {
		f, err := kvmhost.ParseFile(s)
		if err == nil {
			o.Files = append(o.Files, f)
		}
		return err
	})
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 {
		fmt.Fprint(os.Stderr, usage)
		return 2
	}
	o.Binary, o.Args = fs.Arg(0), fs.Args()[1:]
	status, err := kvmhost.Exec(context.Background(), o)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvmhost: %v\n", err)
		if errors.Is(err, kvmhost.ErrTimeout) {
			return 124
		}
		return 125
	}
	return status
}
