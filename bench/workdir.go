package bench

import (
	"fmt"
	"io"
	"os"
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
