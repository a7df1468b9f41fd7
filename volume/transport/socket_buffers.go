package transport

import (
	"net"
	"syscall"
)

// SocketBufferBytes is the UDP receive and send buffer size transport asks
// the kernel for. Bulk block IO arrives in bursts of many MiB; a small
// receive buffer drops packets under a burst and QUIC's loss recovery then
// halves the congestion window.
//
// Linux caps SO_RCVBUF/SO_SNDBUF at net.core.rmem_max/wmem_max (often
// 208 KiB by default) unless the process has CAP_NET_ADMIN, in which case
// the *BUFFORCE options below bypass the cap. A host that serves volumes
// should raise the caps:
//
//	sysctl -w net.core.rmem_max=16777216
//	sysctl -w net.core.wmem_max=16777216
//
// Without that the buffers stay at the cap; everything works, with less
// headroom for bursts (quic-go logs a warning once).
const SocketBufferBytes = 16 << 20

// raiseSocketBuffers asks for SocketBufferBytes in both directions, first
// within the sysctl caps and then, where allowed, past them. Failure is not
// an error: the socket works with whatever the kernel granted.
func raiseSocketBuffers(c *net.UDPConn) {
	_ = c.SetReadBuffer(SocketBufferBytes)
	_ = c.SetWriteBuffer(SocketBufferBytes)
	raw, err := c.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		// The kernel doubles the value it stores; ask for half so the
		// effective size is SocketBufferBytes.
		if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF); err == nil && v < SocketBufferBytes {
			_ = forceBuffer(int(fd), true, SocketBufferBytes/2)
		}
		if v, err := syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF); err == nil && v < SocketBufferBytes {
			_ = forceBuffer(int(fd), false, SocketBufferBytes/2)
		}
	})
}
