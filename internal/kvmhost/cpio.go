package kvmhost

import (
	"fmt"
	"io"
	"path"
	"strings"
)

// cpioWriter writes a cpio archive in the "newc" format the kernel unpacks
// into its initramfs: a 110-byte ASCII header of thirteen 8-digit hex
// fields, the NUL-terminated name, padding to 4 bytes, the data, padding to
// 4 bytes; a "TRAILER!!!" entry ends the archive. Parent directories are
// added before their first child, each once.
type cpioWriter struct {
	w    io.Writer
	ino  uint32
	dirs map[string]bool
	err  error
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: w, ino: 1, dirs: map[string]bool{"": true, "/": true, ".": true}}
}

// cpio mode bits.
const (
	cpioDir     = 0o040000
	cpioFile    = 0o100000
	cpioSymlink = 0o120000
	cpioCharDev = 0o020000
)

// header writes one entry's header and name.
func (c *cpioWriter) header(name string, mode, size uint32) { c.headerDev(name, mode, size, 0, 0) }

// headerDev writes one entry's header and name, with the device number a
// device node stands for.
func (c *cpioWriter) headerDev(name string, mode, size, rdevMajor, rdevMinor uint32) {
	if c.err != nil {
		return
	}
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == cpioDir {
		nlink = 2
	}
	fields := []uint32{c.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevMajor, rdevMinor, uint32(len(name) + 1), 0}
	var b strings.Builder
	b.WriteString("070701")
	for _, f := range fields {
		fmt.Fprintf(&b, "%08x", f)
	}
	b.WriteString(name)
	b.WriteByte(0)
	for b.Len()%4 != 0 {
		b.WriteByte(0)
	}
	_, c.err = io.WriteString(c.w, b.String())
}

// pad writes the zeros that align n data bytes to 4.
func (c *cpioWriter) pad(n int64) {
	if c.err != nil || n%4 == 0 {
		return
	}
	_, c.err = c.w.Write(make([]byte, 4-n%4))
}

// name turns an absolute guest path into an archive name ("bin/sh").
func cpioName(p string) string { return strings.TrimPrefix(path.Clean("/"+p), "/") }

// Dir adds directory p (and its parents) with mode 0755, once.
func (c *cpioWriter) Dir(p string) {
	p = cpioName(p)
	if c.dirs[p] {
		return
	}
	c.Dir(path.Dir(p))
	c.dirs[p] = true
	c.header(p, cpioDir|0o755, 0)
}

// File adds a regular file at p with permission bits perm and the size
// bytes read from r.
func (c *cpioWriter) File(p string, perm uint32, size int64, r io.Reader) {
	p = cpioName(p)
	c.Dir(path.Dir(p))
	if size > 1<<32-1 {
		c.err = fmt.Errorf("adding %s to the initramfs: %d bytes is too large for cpio", p, size)
	}
	c.header(p, cpioFile|perm&0o7777, uint32(size))
	if c.err != nil {
		return
	}
	n, err := io.CopyN(c.w, r, size)
	if err != nil {
		c.err = fmt.Errorf("adding %s to the initramfs: copied %d of %d bytes: %w", p, n, size, err)
		return
	}
	c.pad(size)
}

// Symlink adds a symbolic link at p pointing to target.
func (c *cpioWriter) Symlink(p, target string) {
	p = cpioName(p)
	c.Dir(path.Dir(p))
	c.header(p, cpioSymlink|0o777, uint32(len(target)))
	if c.err == nil {
		_, c.err = io.WriteString(c.w, target)
	}
	c.pad(int64(len(target)))
}

// CharDev adds a character device node at p for device major:minor
// (e.g. /dev/console, 5:1, which the kernel opens for init before any
// devtmpfs is mounted).
func (c *cpioWriter) CharDev(p string, perm, major, minor uint32) {
	p = cpioName(p)
	c.Dir(path.Dir(p))
	c.headerDev(p, cpioCharDev|perm&0o7777, 0, major, minor)
}

// Close writes the trailer and returns the first error met.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0)
	return c.err
}

// CPIO writes an initramfs: a cpio archive in the kernel's "newc" format,
// parent directories added before their first child. Errors are kept and
// Close returns the first.
type CPIO struct{ c *cpioWriter }

// NewCPIO returns a CPIO writing to w.
func NewCPIO(w io.Writer) *CPIO { return &CPIO{c: newCPIOWriter(w)} }

// Dir adds directory p (and its parents).
func (c *CPIO) Dir(p string) { c.c.Dir(p) }

// File adds a regular file p of size bytes read from r, with permissions perm.
func (c *CPIO) File(p string, perm uint32, size int64, r io.Reader) { c.c.File(p, perm, size, r) }

// Symlink adds a symbolic link p to target.
func (c *CPIO) Symlink(p, target string) { c.c.Symlink(p, target) }

// CharDev adds a character device node p for device major:minor.
func (c *CPIO) CharDev(p string, perm, major, minor uint32) { c.c.CharDev(p, perm, major, minor) }

// Close writes the trailer and returns the first error met.
func (c *CPIO) Close() error { return c.c.Close() }
