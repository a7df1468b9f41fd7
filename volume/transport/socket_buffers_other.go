//go:build !linux

package transport

// forceBuffer is Linux-only; elsewhere the buffers stay at what
// SetReadBuffer and SetWriteBuffer obtained.
func forceBuffer(fd int, receive bool, bytes int) error { return nil }
