// Command tern-bench holds the benchmarks and simulation campaigns:
// `tern bench …` runs it (the tern binary finds it beside itself, on
// PATH, or builds it from its source tree). It is a binary of its own so
// that the scenarios, the simulator (with its test-only switches in the
// decision cores), the fault campaigns and the data plane's benchmark are
// linked into no vmm, downstairs or CLI process (docs/ARCHITECTURE.md,
// "Processes"). It starts the tern binary that ran it for the processes
// it measures.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"tern/cmd/internal/serve"
)

var logLevel string

func main() {
	root := &cobra.Command{
		Use:           "tern",
		Short:         "tern's benchmarks (run as tern bench …)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "", "log level: debug, info, warn or error (default "+serve.ClientLogLevel+")")
	root.AddCommand(newBenchCmd())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "tern: %v\n", err)
		os.Exit(1)
	}
}
