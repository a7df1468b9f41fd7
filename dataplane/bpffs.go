package dataplane

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// MountBPFFS mounts a bpffs on dir (an existing directory, usually
// /sys/fs/bpf) unless one is there already.
func MountBPFFS(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return fmt.Errorf("reading the file system of %s: %w", dir, err)
	}
	if st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting a bpffs on %s: %w", dir, err)
	}
	return nil
}
