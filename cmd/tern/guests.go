package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"tern/vmm/guests"
)

func init() { rootCmd.AddCommand(newGuestsCmd()) }

func newGuestsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "guests",
		Short: "tern's built-in test guests (hello, dirty, disk, echo, demo)",
	}
	var out string
	build := &cobra.Command{
		Use:   "build --out DIR",
		Short: "Write each built-in test guest as DIR/<name>.elf",
		Long: `Write each built-in test guest as DIR/<name>.elf. The files are the ones
embedded in tern; each runs under tern (64-bit entry) and under
qemu-system-x86_64 -M microvm -kernel FILE (PVH entry).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if err := os.MkdirAll(out, 0o755); err != nil {
				return fmt.Errorf("creating %s: %w", out, err)
			}
			for _, name := range guests.Names() {
				b, err := guests.ELF(name)
				if err != nil {
					return err
				}
				path := filepath.Join(out, name+".elf")
				if err := os.WriteFile(path, b, 0o644); err != nil {
					return fmt.Errorf("writing guest %s: %w", name, err)
				}
				fmt.Fprintln(cmd.OutOrStdout(), path)
			}
			return nil
		},
	}
	build.Flags().StringVar(&out, "out", "", "directory to write the guests to (created if missing)")
	cmd.AddCommand(build)
	return cmd
}
