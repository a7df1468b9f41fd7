// Command tern is the storage-and-VM data-plane appliance: one binary whose
// subcommands run the volume replicas, the VMM, the CLI over the control
// API, and the benchmarks. This package only wires flags to the packages
// that do the work.
package main

import (
	"fmt"
	"os"
)

func main() {
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintf(os.Stderr, "tern: %v\n", err)
		os.Exit(exitCode(err))
	}
}
