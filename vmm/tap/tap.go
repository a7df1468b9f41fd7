package tap

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"unicode"

	"golang.org/x/sys/unix"
)

// ErrClosed is returned by ReadFrame and WriteFrame after Close.
var ErrClosed = os.ErrClosed

// MaxNameLen is the longest interface name Linux takes (IFNAMSIZ - 1).
const MaxNameLen = unix.IFNAMSIZ - 1

// Device is an open TAP interface.
type Device struct {
	// Immutable after Open.
	name string
	f    *os.File
}

// ValidName checks name as Linux checks an interface name
// (dev_valid_name): 1 to 15 bytes, not "." or "..", and no '/', ':' or
// white space.
func ValidName(name string) error {
	switch {
	case name == "":
		return errors.New("empty interface name")
	case len(name) > MaxNameLen:
		return fmt.Errorf("interface name %q is longer than %d bytes", name, MaxNameLen)
	case name == "." || name == "..":
		return fmt.Errorf("interface name %q is reserved", name)
	case strings.ContainsAny(name, "/:"):
		return fmt.Errorf("interface name %q holds '/' or ':'", name)
	case strings.IndexFunc(name, unicode.IsSpace) >= 0 || strings.ContainsRune(name, 0):
		return fmt.Errorf("interface name %q holds white space or a NUL", name)
	}
	return nil
}

// Open attaches to the TAP interface name, creating it if it does not
// exist (see the package comment).
func Open(name string) (*Device, error) {
	if err := ValidName(name); err != nil {
		return nil, fmt.Errorf("opening tap: %w", err)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("opening /dev/net/tun for tap %s: %w", name, err)
	}
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("opening tap %s: %w", name, err)
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		if errors.Is(err, unix.EBUSY) {
			return nil, fmt.Errorf("attaching to tap %s: %w (it is already attached: a single-queue TAP takes one reader)", name, err)
		}
		if errors.Is(err, unix.EINVAL) {
			return nil, fmt.Errorf("attaching to tap %s: %w (an interface of that name exists but is not a single-queue TAP without a vnet header)", name, err)
		}
		return nil, fmt.Errorf("attaching to tap %s: %w", name, err)
	}
	// A non-blocking descriptor goes into the runtime poller: reads park
	// the goroutine, not a thread, and Close wakes them.
	return &Device{name: name, f: os.NewFile(uintptr(fd), "tap:"+name)}, nil
}

// Name is the interface's name.
func (d *Device) Name() string { return d.name }

// ReadFrame reads one frame into p and returns its length, waiting for
// one to arrive. A frame longer than p is cut to len(p) by the kernel, so
// p should hold the largest frame the interface's MTU allows.
func (d *Device) ReadFrame(p []byte) (int, error) {
	n, err := d.f.Read(p)
	if err != nil {
		return 0, fmt.Errorf("reading tap %s: %w", d.name, err)
	}
	return n, nil
}

// WriteFrame sends one frame out of the interface (towards the host).
func (d *Device) WriteFrame(p []byte) error {
	if _, err := d.f.Write(p); err != nil {
		return fmt.Errorf("writing tap %s: %w", d.name, err)
	}
	return nil
}

// Close closes the descriptor; a ReadFrame waiting on another goroutine
// returns ErrClosed. An interface Open created goes with it.
func (d *Device) Close() error {
	if err := d.f.Close(); err != nil {
		return fmt.Errorf("closing tap %s: %w", d.name, err)
	}
	return nil
}
