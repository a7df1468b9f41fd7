package ec

import (
	"net"
	"strings"
	"testing"
	"time"

	"tern/volume/chaos"
)

// A data shard that is alive but slow (every datagram delayed past the
// reply timeout) does not hold reads up for longer than that: the read
// gives up on it, reconstructs its blocks from the other shards, and the
// shard is dropped with the reason in Status.
func TestSlowDataShardIsReconstructedAround(t *testing.T) {
	c := newTestCluster(t, DefaultLayout)
	target, err := net.ResolveUDPAddr("udp", c.targets[1])
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := chaos.NewProxy("127.0.0.1:0", target, func() (*net.UDPConn, error) {
		return net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	c.targets[1] = proxy.Addr().String()
	cfg := c.config()
	cfg.ReplyTimeout = 500 * time.Millisecond
	cfg.IdleTimeout = 10 * time.Second
	cfg.KeepAlivePeriod = time.Second
	v, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if err := v.Activate(ctxT(t), 1); err != nil {
		t.Fatal(err)
	}
	want := pattern(3, 0, 16*testBlockSize)
	mustWrite(t, v, want, 0)
	waitFor(t, v, "every shard applied the write", allActive)
	if err := proxy.SetImpairment(chaos.Impairment{Delay: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	mustRead(t, v, want, 0)
	st := waitFor(t, v, "shard 1 dropped as slow", func(st Status) bool { return st.Shards[1].State == ShardOffline })
	if !strings.Contains(st.Shards[1].FaultReason, "no answer to a read") {
		t.Fatalf("shard 1 fault reason %q; want the read timeout", st.Shards[1].FaultReason)
	}
}
