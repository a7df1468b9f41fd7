package serve

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// Main runs a sibling binary's command tree (its root named "tern", so
// its commands read as tern's) until it returns, with SIGINT and SIGTERM
// cancelling the command's context: servers stop cleanly and one-shot
// commands abandon their work. An error is printed after prefix and ends
// the process with status 1.
func Main(root *cobra.Command, prefix string) {
	root.SilenceUsage, root.SilenceErrors = true, true
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := root.ExecuteContext(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", prefix, err)
		os.Exit(1)
	}
}

// NewRoot is a sibling binary's root command, named "tern" so that its
// commands read as tern's, with tern's --log-level flag bound to level.
func NewRoot(short, defaultLevel string, level *string) *cobra.Command {
	root := &cobra.Command{Use: "tern", Short: short}
	root.PersistentFlags().StringVar(level, "log-level", "", "log level: debug, info, warn or error (default "+defaultLevel+")")
	return root
}
