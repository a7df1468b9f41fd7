package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"tern/vmm/guests"
	"tern/vmm/linuxguest"
)

func init() { rootCmd.AddCommand(newGuestsCmd()) }

func newGuestsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "guests",
		Short: "tern's built-in test guests (hello, dirty, disk, echo, demo) and its Linux guest",
	}
	var out string
	build := &cobra.Command{
		Use:   "build --out DIR",
		Short: "Write each built-in test guest as DIR/<name>.elf",
		Long: `Write each built-in test guest as DIR/<name>.elf. The files are the ones
embedded in tern; each runs under tern (64-bit entry) and under
qemu-system-x86_64 -M microvm -bios qboot.rom -kernel FILE (PVH entry).`,
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
	cmd.AddCommand(build, newGuestsLinuxCmd())
	return cmd
}

func newGuestsLinuxCmd() *cobra.Command {
	var out, cache string
	cmd := &cobra.Command{
		Use:   "linux --out DIR [--cache DIR]",
		Short: "Write a Linux kernel and userland initramfs built from Debian packages as DIR/vmlinuz and DIR/initramfs",
		Long: `Write Debian's stock kernel (the package linux-image-amd64 depends on) as
DIR/vmlinuz and an initramfs assembled from Debian packages as
DIR/initramfs: busybox-static, e2fsprogs with their shared libraries, and
the kernel's virtio-mmio, virtio-blk, virtio-net and ext4 modules. Its
/init loads the modules, prints "` + linuxguest.ReadyLine + `" and runs a shell
on the console; the shell's exit status becomes tern vmm run's.

The packages are fetched with apt-get download (a Debian host with apt's
package lists; as root tern runs apt-get update when they are missing),
unpacked with dpkg-deb and never installed; the result is cached (--cache,
default $` + linuxguest.CacheEnv + ` or tern-linuxguest in the user's cache
directory).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if cache == "" {
				var err error
				if cache, err = linuxguest.DefaultCacheDir(); err != nil {
					return err
				}
			}
			f, err := linuxguest.Build(cmd.Context(), cache, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			kernel, initrd, err := f.WriteTo(out)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			fmt.Fprintf(w, "%s\n%s\n", kernel, initrd)
			fmt.Fprintf(w, "# %s (%s), modules %s\n", f.KernelPackage, f.Release, strings.Join(f.Modules, " "))
			fmt.Fprintf(w, "# boot it with:\ntern vmm run --kernel %s --initrd %s --cmdline '%s' --memory 256MiB\n", kernel, initrd, linuxguest.Cmdline)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write vmlinuz and initramfs to (created if missing)")
	cmd.Flags().StringVar(&cache, "cache", "", "cache directory (default $"+linuxguest.CacheEnv+" or the user's cache directory)")
	return cmd
}
