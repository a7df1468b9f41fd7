package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// localFileLimit runs shape against one plain file of spaceBytes in dir
// with pread/pwrite (page cache, no fsync): the storage limit a downstairs
// cannot beat.
func localFileLimit(ctx context.Context, dir string, shape IOShape, spaceBytes int64, d time.Duration) (Result, error) {
	f, err := os.Create(filepath.Join(dir, "limit.img"))
	if err != nil {
		return Result{}, fmt.Errorf("creating limit file: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if err := f.Truncate(spaceBytes); err != nil {
		return Result{}, fmt.Errorf("sizing limit file: %w", err)
	}
	if !shape.Write {
		// Reads of a hole cost nothing; read written data as the volume does.
		if err := fillFile(f, spaceBytes); err != nil {
			return Result{}, err
		}
	}
	return runLoad(ctx, shape, spaceBytes, d, func(_ context.Context, _ int, buf []byte, off int64) error {
		if shape.Write {
			_, err := f.WriteAt(buf, off)
			return err
		}
		_, err := f.ReadAt(buf, off)
		return err
	})
}

func fillFile(f *os.File, size int64) error {
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i*7 + 1)
	}
	for off := int64(0); off < size; off += int64(len(chunk)) {
		if _, err := f.WriteAt(chunk[:min(int64(len(chunk)), size-off)], off); err != nil {
			return fmt.Errorf("filling limit file: %w", err)
		}
	}
	return nil
}
