package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"tern/internal/tlsconf"
)

func init() { rootCmd.AddCommand(newCertsCmd()) }

func newCertsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "certs",
		Short: "Create development certificates for mutual TLS between tern endpoints",
	}
	cmd.AddCommand(newCertsInitCmd())
	return cmd
}

func newCertsInitCmd() *cobra.Command {
	var (
		dir   string
		hosts []string
		force bool
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create a development CA and a node certificate in --dir",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if strings.TrimSpace(dir) == "" {
				return fmt.Errorf("--dir is required")
			}
			if err := tlsconf.Generate(dir, hosts, force); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s, %s, %s, %s in %s\n",
				tlsconf.CAFile, tlsconf.CAKeyFile, tlsconf.NodeFile, tlsconf.NodeKeyFile, dir)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory for ca.pem, ca-key.pem, node.pem and node-key.pem")
	cmd.Flags().StringSliceVar(&hosts, "hosts", tlsconf.DefaultHosts, "IP addresses and DNS names the node certificate is valid for")
	cmd.Flags().BoolVar(&force, "force", false, "replace existing certificate files")
	return cmd
}
