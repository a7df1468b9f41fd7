package bench

import (
	"fmt"
	"io"
	"os"

	"tern/volume/extent"
	"tern/volume/volumetest"
)

// workDir returns dir, or a new temporary directory (removed by cleanup)
// when dir is empty.
func workDir(dir, prefix string) (string, func(), error) {
	if dir != "" {
		return dir, func() {}, nil
	}
	tmp, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", nil, fmt.Errorf("creating work directory: %w", err)
	}
	return tmp, func() { os.RemoveAll(tmp) }, nil
}

// sayer prints a progress line to w, or nothing when w is nil.
func sayer(w io.Writer) func(format string, args ...any) {
	return func(format string, args ...any) {
		if w != nil {
			fmt.Fprintf(w, format+"\n", args...)
		}
	}
}

// newCluster makes a volume of sizeBytes (4 KiB blocks, 64 MiB extents) on
// three loopback downstairs in dir, or in a temporary directory when dir
// is empty. The replicas are created but not started; cleanup closes them
// and removes a temporary directory.
func newCluster(dir, prefix string, sizeBytes uint64) (*volumetest.Cluster, func(), error) {
	dir, removeDir, err := workDir(dir, prefix)
	if err != nil {
		return nil, nil, err
	}
	spec, err := extent.SpecForSize(sizeBytes, 4096)
	if err == nil {
		var cl *volumetest.Cluster
		if cl, err = volumetest.NewCluster(dir, spec); err == nil {
			return cl, func() { cl.Close(); removeDir() }, nil
		}
	}
	removeDir()
	return nil, nil, err
}
