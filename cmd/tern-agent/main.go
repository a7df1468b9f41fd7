// Command tern-agent is the host agent: `tern agent` runs it (the tern binary finds
// it beside itself, on PATH, or builds it from its source tree). It is a
// binary of its own so that the eBPF loader and netlink it links are in
// the one process per host that runs the data plane, not in every vmm,
// downstairs and CLI process (docs/ARCHITECTURE.md, "Processes").
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
		Short:         "tern's host agent (run as tern agent)",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&logLevel, "log-level", "", "log level: debug, info, warn or error (default "+serve.ServerLogLevel+" for servers)")
	root.AddCommand(newAgentCmd())
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "tern: %v\n", err)
		os.Exit(1)
	}
}
