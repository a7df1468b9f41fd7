// Command tern is the storage-and-VM data-plane appliance: one binary whose
// subcommands run the volume replicas, the VMM, the CLI over the control
// API, and the benchmarks. This package only wires flags to the packages
// that do the work.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"tern/internal/kvmhost"
)

func main() {
	if kvmhost.IsInit() {
		// tern up runs its vmm in the emulated test host with tern as /init.
		kvmhost.RunInit()
	}
	// SIGINT and SIGTERM cancel the command's context: servers stop
	// cleanly and one-shot commands abandon their work.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := rootCmd.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "tern: %v\n", err)
		os.Exit(exitCode(err))
	}
}
