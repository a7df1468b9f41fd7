package chaos

import (
	"fmt"
	"net"
	"testing"
	"time"

	"tern/internal/testwait"
)

// echoServer answers every datagram with itself until the test ends.
func echoServer(t *testing.T) *net.UDPAddr {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			c.WriteToUDP(buf[:n], from)
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return c.LocalAddr().(*net.UDPAddr)
}

func loopbackDial() (*net.UDPConn, error) {
	return net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
}

func newTestProxy(t *testing.T, imp Impairment) (*Proxy, *net.UDPConn) {
	t.Helper()
	p, err := NewProxy("127.0.0.1:0", echoServer(t), loopbackDial, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	if err := p.SetImpairment(imp); err != nil {
		t.Fatal(err)
	}
	c, err := net.DialUDP("udp", nil, p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return p, c
}

// roundTrips sends n numbered datagrams and counts the echoes received
// until want arrived or the deadline passed.
func roundTrips(t *testing.T, c *net.UDPConn, n, want int) map[string]int {
	t.Helper()
	for i := range n {
		if _, err := fmt.Fprintf(c, "datagram %d", i); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]int{}
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 2048)
	for total := 0; total < want; total++ {
		k, err := c.Read(buf)
		if err != nil {
			t.Fatalf("after %d of %d echoes: %v", total, want, err)
		}
		got[string(buf[:k])]++
	}
	return got
}

func TestProxyForwardsBothWaysWithDelay(t *testing.T) {
	_, c := newTestProxy(t, Impairment{Delay: 2 * time.Millisecond, Jitter: time.Millisecond})
	got := roundTrips(t, c, 50, 50)
	if len(got) != 50 {
		t.Fatalf("%d distinct echoes, want 50", len(got))
	}
}

func TestProxyDuplicatesInBothDirections(t *testing.T) {
	// Each datagram is doubled on the way out and each copy again on the
	// way back: four echoes per datagram.
	p, c := newTestProxy(t, Impairment{Duplicate: 1})
	got := roundTrips(t, c, 10, 40)
	for k, n := range got {
		if n != 4 {
			t.Errorf("%q echoed %d times, want 4", k, n)
		}
	}
	if s := p.Stats(); s.Received != 30 || s.Duplicated != 30 || s.Dropped != 0 {
		t.Errorf("stats %+v, want 30 received and duplicated (10 out, 20 back)", s)
	}
}

func TestProxyDropsEverythingOnCertainLoss(t *testing.T) {
	p, c := newTestProxy(t, Impairment{Loss: 1})
	for i := range 20 {
		fmt.Fprintf(c, "datagram %d", i)
	}
	testwait.For(t, 30*time.Second, "proxy received 20 datagrams", func() bool { return p.Stats().Received >= 20 })
	if s := p.Stats(); s.Dropped != 20 || s.Forwarded != 0 {
		t.Fatalf("stats %+v, want all 20 dropped", s)
	}
}

func TestProxyRefusesInvalidImpairment(t *testing.T) {
	p, _ := newTestProxy(t, Impairment{})
	if err := p.SetImpairment(Impairment{Loss: 2}); err == nil {
		t.Fatal("loss 2 accepted")
	}
}
