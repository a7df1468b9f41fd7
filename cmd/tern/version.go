package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"tern/cmd/internal/serve"
)

func init() { rootCmd.AddCommand(newVersionCmd()) }

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print tern's module version and VCS revision",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fmt.Fprintln(cmd.OutOrStdout(), serve.BuildVersion())
			return nil
		},
	}
}
