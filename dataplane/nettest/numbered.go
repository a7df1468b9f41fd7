package nettest

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"
)

// NumberedRate is how many numbered datagrams a Numbered sender sends a
// second unless told otherwise: the rate of the data-plane issue's
// migration test.
const NumberedRate = 1000

// Numbered sends datagrams numbered 0, 1, 2, … (the payload is the
// number, 4 bytes big-endian) at a fixed rate: at NumberedRate datagram n
// is due n milliseconds after the start, and a late tick sends all that
// are due, so the rate holds on a busy machine. It records when it sent
// each.
type Numbered struct {
	conn  *net.UDPConn
	dst   netip.AddrPort
	limit uint32
	rate  int
	stop  chan struct{}
	done  chan struct{}
	once  sync.Once

	mu   sync.Mutex
	sent []time.Time
	err  error
}

// SendNumbered starts sending from conn to dst until limit datagrams
// were sent or Stop is called.
func SendNumbered(conn *net.UDPConn, dst netip.AddrPort, limit uint32) *Numbered {
	return SendNumberedAt(conn, dst, limit, NumberedRate)
}

// SendNumberedAt is SendNumbered at rate datagrams a second (at least 1).
func SendNumberedAt(conn *net.UDPConn, dst netip.AddrPort, limit uint32, rate int) *Numbered {
	n := &Numbered{conn: conn, dst: dst, limit: limit, rate: max(rate, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go n.run()
	return n
}

func (n *Numbered) run() {
	defer close(n.done)
	tick := time.NewTicker(time.Second / time.Duration(n.rate))
	defer tick.Stop()
	start := time.Now()
	var msg [4]byte
	for seq := uint32(0); seq < n.limit; {
		select {
		case <-tick.C:
		case <-n.stop:
			return
		}
		due := uint64(time.Since(start) * time.Duration(n.rate) / time.Second)
		for ; seq < n.limit && uint64(seq) <= due; seq++ {
			binary.BigEndian.PutUint32(msg[:], seq)
			at := time.Now()
			if _, err := n.conn.WriteToUDPAddrPort(msg[:], n.dst); err != nil {
				n.mu.Lock()
				n.err = fmt.Errorf("sending datagram %d to %v: %w", seq, n.dst, err)
				n.mu.Unlock()
				return
			}
			n.mu.Lock()
			n.sent = append(n.sent, at)
			n.mu.Unlock()
		}
	}
}

// SentAt returns when datagram seq was sent (the zero time if it was not).
func (n *Numbered) SentAt(seq uint32) time.Time {
	n.mu.Lock()
	defer n.mu.Unlock()
	if int(seq) >= len(n.sent) {
		return time.Time{}
	}
	return n.sent[seq]
}

// Done is closed when the sender has ended: its limit sent, stopped, or
// failed.
func (n *Numbered) Done() <-chan struct{} { return n.done }

// Stop ends the sender, waits for it and returns how many it sent and
// the error that ended it early, if one did.
func (n *Numbered) Stop() (uint32, error) {
	n.once.Do(func() { close(n.stop) })
	<-n.done
	n.mu.Lock()
	defer n.mu.Unlock()
	return uint32(len(n.sent)), n.err
}
