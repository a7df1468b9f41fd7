package migration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// The same-host hand-over: the source listens on a unix socket; once the
// preamble is sent the target connects and sends the preamble's nonce
// (which only a peer of the mutual-TLS connection knows); the source
// checks it and sends the memfds of every region, in preamble order, in
// one message (SCM_RIGHTS) whose data is the nonce again. The target maps
// them and builds its VM, parked, before it answers ready: the guest runs
// on at the source meanwhile, on the very same pages, and none of the
// building is downtime.

// fdServer is the source's unix listener.
type fdServer struct {
	ln    *net.UnixListener
	nonce [nonceSize]byte
}

func listenFds(path string, nonce [nonceSize]byte) (*fdServer, error) {
	os.Remove(path) // a stale socket of an earlier attempt
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening for the memfd hand-over: %w", err)
	}
	return &fdServer{ln: ln, nonce: nonce}, nil
}

// Close stops listening and removes the socket.
func (f *fdServer) Close() error { return f.ln.Close() }

// handOver serves the target one connection: the nonce in, the memfds
// out. The target's ready acknowledges them.
func (s *source) handOver(ctx context.Context, f *fdServer) error {
	deadline := time.Now().Add(30 * time.Second)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	f.ln.SetDeadline(deadline)
	c, err := f.ln.AcceptUnix()
	if err != nil {
		return fmt.Errorf("accepting the memfd hand-over: %w", err)
	}
	defer c.Close()
	c.SetDeadline(deadline)
	var got [nonceSize]byte
	if _, err := c.Read(got[:]); err != nil {
		return fmt.Errorf("reading the memfd hand-over nonce: %w", err)
	}
	if got != f.nonce {
		return fmt.Errorf("memfd hand-over: %w: wrong nonce", ErrIncompatible)
	}
	var fds []int
	for _, r := range s.cfg.VM.Memory().Regions() {
		fds = append(fds, r.Fd())
	}
	if _, _, err := c.WriteMsgUnix(f.nonce[:], unix.UnixRights(fds...), nil); err != nil {
		return fmt.Errorf("sending the memfds: %w", err)
	}
	return nil
}

// receiveFds is the target's side: it returns n memfds, which the caller
// owns.
func receiveFds(ctx context.Context, path string, nonce [nonceSize]byte, n int) (_ []int, err error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("connecting for the memfds: %w", err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write(nonce[:]); err != nil {
		return nil, fmt.Errorf("sending the memfd nonce: %w", err)
	}
	buf := make([]byte, nonceSize)
	oob := make([]byte, unix.CmsgSpace(4*n))
	nb, noob, _, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, fmt.Errorf("receiving the memfds: %w", err)
	}
	var fds []int
	defer func() {
		if err != nil {
			for _, fd := range fds {
				unix.Close(fd)
			}
		}
	}()
	msgs, err := unix.ParseSocketControlMessage(oob[:noob])
	if err != nil {
		return nil, fmt.Errorf("receiving the memfds: %w", err)
	}
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return nil, fmt.Errorf("receiving the memfds: %w", err)
		}
		fds = append(fds, got...)
	}
	if !bytes.Equal(buf[:nb], nonce[:]) {
		return nil, fmt.Errorf("receiving the memfds: %w: wrong nonce", ErrIncompatible)
	}
	if len(fds) != n {
		return nil, fmt.Errorf("receiving the memfds: %w: %d fds for %d regions", ErrIncompatible, len(fds), n)
	}
	return fds, nil
}
