package extent

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// FS is the file system a Region keeps its files on, by name inside the
// region directory. Create and Open use the operating system's (osFS);
// CreateOn and OpenOn take any, such as the simulated disk of package
// tern/volume/sim, which keeps only what was synced. An FS is the few
// calls the region makes, no more.
type FS interface {
	// OpenFile opens an existing file for reading and, unless readOnly,
	// writing. A missing file fails with an error wrapping fs.ErrNotExist.
	OpenFile(name string, readOnly bool) (File, error)
	// CreateFile creates name, or truncates it, sized to size zero bytes
	// (sparse where the file system allows).
	CreateFile(name string, size int64) (File, error)
	// ReadFile returns the whole of name; fs.ErrNotExist when missing.
	ReadFile(name string) ([]byte, error)
	// WriteFileAtomic durably replaces name with data: after a crash the
	// file holds either its old content or data, never a mix.
	WriteFileAtomic(name string, data []byte) error
	// Remove removes name; fs.ErrNotExist when missing.
	Remove(name string) error
	// SyncAll makes every file durable.
	SyncAll() error
}

// File is an open extent file.
type File interface {
	ReadAt(p []byte, off int64) (int, error)
	WriteAt(p []byte, off int64) (int, error)
	// Datasync makes the file's data, and the metadata needed to read it,
	// durable (fdatasync).
	Datasync() error
	// Size returns the file's length in bytes.
	Size() (int64, error)
	Close() error
}

// osFS is the operating system's file system under dir; lock is the
// flock'd directory, used to sync it.
type osFS struct {
	dir  string
	lock *os.File
}

func (o osFS) path(name string) string { return filepath.Join(o.dir, name) }

func (o osFS) OpenFile(name string, readOnly bool) (File, error) {
	flag := os.O_RDWR
	if readOnly {
		flag = os.O_RDONLY
	}
	f, err := os.OpenFile(o.path(name), flag, 0)
	if err != nil {
		return nil, err
	}
	return &osFile{f: f, fd: int(f.Fd())}, nil
}

func (o osFS) CreateFile(name string, size int64) (File, error) {
	f, err := os.OpenFile(o.path(name), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, err
	}
	return &osFile{f: f, fd: int(f.Fd())}, nil
}

func (o osFS) ReadFile(name string) ([]byte, error) { return os.ReadFile(o.path(name)) }

func (o osFS) WriteFileAtomic(name string, data []byte) error {
	return writeFileAtomic(o.lock, o.dir, name, data)
}

func (o osFS) Remove(name string) error { return os.Remove(o.path(name)) }

func (o osFS) SyncAll() error {
	if err := unix.Syncfs(int(o.lock.Fd())); err != nil {
		return os.NewSyscallError("syncfs", err)
	}
	return nil
}

// osFile is an open file of osFS, read and written with pread and pwrite
// on its descriptor.
type osFile struct {
	f  *os.File // owns fd
	fd int
}

func (o *osFile) ReadAt(p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pread(o.fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, os.NewSyscallError("pread", err)
		}
		return n, nil
	}
}

func (o *osFile) WriteAt(p []byte, off int64) (int, error) {
	for {
		n, err := unix.Pwrite(o.fd, p, off)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, os.NewSyscallError("pwrite", err)
		}
		return n, nil
	}
}

func (o *osFile) Datasync() error {
	for {
		err := unix.Fdatasync(o.fd)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return os.NewSyscallError("fdatasync", err)
		}
		return nil
	}
}

func (o *osFile) Size() (int64, error) {
	st, err := o.f.Stat()
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}

func (o *osFile) Close() error { return o.f.Close() }

// isNotExist reports whether err says a file is missing.
func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
