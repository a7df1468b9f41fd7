package main

import (
	"errors"
	"log/slog"

	"tern/cmd/internal/serve"

	"github.com/spf13/cobra"
)

// rootCmd is the tern command; each subcommand file adds itself in init.
var rootCmd = &cobra.Command{
	Use:   "tern",
	Short: "tern: replicated block volumes and a KVM VMM for one host of a rack",
	Long: `tern runs a host's data plane: downstairs replicas that serve a region over
QUIC with mutual TLS, an upstairs that replicates volumes across three of
them, the VMM, and the tools to operate and benchmark them.`,
	SilenceUsage:  true,
	SilenceErrors: true,
}

var logLevel string

func init() {
	rootCmd.PersistentFlags().StringVar(&logLevel, "log-level", "",
		"log level: debug, info, warn or error (default "+serve.ServerLogLevel+" for servers, "+serve.ClientLogLevel+" for client commands)")
	rootCmd.CompletionOptions.HiddenDefaultCmd = true
}

// newLogger builds the process logger from --log-level, or at defaultLevel
// when it is not given.
func newLogger(defaultLevel string) (*slog.Logger, error) {
	return serve.Logger(logLevel, defaultLevel)
}

// exitError carries a specific process exit status out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitCode(err error) int {
	var e *exitError
	if errors.As(err, &e) {
		return e.code
	}
	return 1
}
