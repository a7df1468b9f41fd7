package nettest

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/sys/unix"
)

// ListenUDP opens a UDP socket on addr in the namespace.
func (n *Netns) ListenUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := n.Do(func() (err error) {
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(addr))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("listening on udp %v in %s: %w", addr, n.Name, err)
	}
	return c, nil
}

// Echo answers every UDP datagram on its socket with the same bytes.
type Echo struct {
	conn *net.UDPConn
	done chan struct{}
}

// StartEcho serves UDP echo on addr in the namespace until Close.
func (n *Netns) StartEcho(addr netip.AddrPort) (*Echo, error) {
	c, err := n.ListenUDP(addr)
	if err != nil {
		return nil, err
	}
	e := &Echo{conn: c, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		buf := make([]byte, 64<<10)
		for {
			k, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			c.WriteToUDPAddrPort(buf[:k], from)
		}
	}()
	return e, nil
}

// Close stops the echo and waits for its goroutine.
func (e *Echo) Close() error {
	err := e.conn.Close()
	<-e.done
	return err
}

// RoundTrip sends payload from conn to dst and waits until timeout for the
// same bytes to come back, resending every 200 ms (the first packets to a
// new neighbour can wait on ARP).
func RoundTrip(conn *net.UDPConn, dst netip.AddrPort, payload []byte, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	buf := make([]byte, len(payload)+1)
	for time.Now().Before(deadline) {
		if _, err := conn.WriteToUDPAddrPort(payload, dst); err != nil {
			return fmt.Errorf("sending to %v: %w", dst, err)
		}
		conn.SetReadDeadline(earliest(deadline, time.Now().Add(200*time.Millisecond)))
		for {
			k, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				break
			}
			if from == dst && string(buf[:k]) == string(payload) {
				conn.SetReadDeadline(time.Time{})
				return nil
			}
		}
	}
	conn.SetReadDeadline(time.Time{})
	return fmt.Errorf("no echo from %v within %v", dst, timeout)
}

// Ping sends ICMP echo requests from the namespace to dst (one every
// 200 ms) until a reply comes or timeout passes.
func (n *Netns) Ping(dst netip.Addr, timeout time.Duration) error {
	var c *icmp.PacketConn
	if err := n.Do(func() (err error) { c, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0"); return err }); err != nil {
		return fmt.Errorf("opening an icmp socket in %s: %w", n.Name, err)
	}
	defer c.Close()
	var idb [2]byte
	rand.Read(idb[:])
	id := int(binary.BigEndian.Uint16(idb[:]))
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for seq := 1; time.Now().Before(deadline); seq++ {
		req := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("tern")}}
		b, err := req.Marshal(nil)
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return fmt.Errorf("pinging %v: %w", dst, err)
		}
		c.SetReadDeadline(earliest(deadline, time.Now().Add(200*time.Millisecond)))
		for {
			k, from, err := c.ReadFrom(buf)
			if err != nil {
				break
			}
			m, err := icmp.ParseMessage(1, buf[:k])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && from.String() == dst.String() {
				return nil
			}
		}
	}
	return fmt.Errorf("no ping reply from %v within %v", dst, timeout)
}

// SendFrame writes one raw Ethernet frame out of dev in the namespace.
func (n *Netns) SendFrame(dev string, frame []byte) error {
	ifindex, err := n.Ifindex(dev)
	if err != nil {
		return err
	}
	return n.Do(func() error {
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return fmt.Errorf("opening a packet socket: %w", err)
		}
		defer unix.Close(fd)
		if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifindex, Halen: 6}); err != nil {
			return fmt.Errorf("sending a frame on %s: %w", dev, err)
		}
		return nil
	})
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
