package nettest

import (
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// OpenTAP creates the TAP device name in the namespace, up, and returns
// its file: what a VMM's virtio-net backend holds. Writing a frame to it
// is the guest sending; reading one is the guest receiving. Closing the
// file removes the device.
func (n *Netns) OpenTAP(name string) (*os.File, error) {
	var f *os.File
	err := n.Do(func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("opening /dev/net/tun: %w", err)
		}
		var req [unix.IFNAMSIZ + 64]byte
		copy(req[:unix.IFNAMSIZ-1], name)
		*(*uint16)(unsafe.Pointer(&req[unix.IFNAMSIZ])) = unix.IFF_TAP | unix.IFF_NO_PI
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req[0]))); errno != 0 {
			unix.Close(fd)
			return fmt.Errorf("creating tap %s: %w", name, errno)
		}
		f = os.NewFile(uintptr(fd), "tap:"+name)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if err := n.Up(name); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}
