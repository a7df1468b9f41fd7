package main

import (
	"fmt"
	"runtime/debug"

	"github.com/spf13/cobra"
)

func init() { rootCmd.AddCommand(newVersionCmd()) }

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print tern's module version and VCS revision",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), versionString())
			return nil
		},
	}
}

// versionString reads the module version and, when the build recorded
// them, the VCS revision, time and dirty flag.
func versionString() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "tern (unknown version)"
	}
	s := "tern " + info.Main.Version
	var rev, when, modified string
	for _, kv := range info.Settings {
		switch kv.Key {
		case "vcs.revision":
			rev = kv.Value
		case "vcs.time":
			when = kv.Value
		case "vcs.modified":
			modified = kv.Value
		}
	}
	if rev != "" {
		s += " revision " + rev
		if modified == "true" {
			s += "-dirty"
		}
		if when != "" {
			s += " (" + when + ")"
		}
	}
	return s + " " + info.GoVersion
}
