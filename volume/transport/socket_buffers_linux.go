package transport

import "syscall"

// forceBuffer sets a socket buffer past net.core.{r,w}mem_max; it needs
// CAP_NET_ADMIN and fails harmlessly without it.
func forceBuffer(fd int, receive bool, bytes int) error {
	opt := syscall.SO_SNDBUFFORCE
	if receive {
		opt = syscall.SO_RCVBUFFORCE
	}
	return syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, opt, bytes)
}
