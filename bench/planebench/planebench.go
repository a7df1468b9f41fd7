package planebench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tern/dataplane"
	"tern/dataplane/nettest"
)

// DataplaneOptions configure RunDataplane.
type DataplaneOptions struct {
	// RoundTrips is the number of UDP round trips timed on each path
	// (default 20,000), in blocks alternating between the paths.
	RoundTrips int
	// Duration is how long each path's throughput is measured (default 5 s).
	Duration time.Duration
	// Progress, when set, gets a line as each step starts.
	Progress io.Writer
}

// DataplaneReport is the JSON `tern bench dataplane --json` writes; the
// keys throughput_ratio and p99_ratio (eBPF path / plain routed path)
// are a contract.
type DataplaneReport struct {
	ThroughputRatio float64 `json:"throughput_ratio"`
	P99Ratio        float64 `json:"p99_ratio"`
	// EBPF is two VMs in one VNI on two hosts through the data plane
	// (tc programs, VXLAN); Plain the same namespaces over a second veth
	// each, routed by the hosts with no encapsulation.
	EBPF  DataplanePath `json:"ebpf"`
	Plain DataplanePath `json:"plain"`
	// LatencyPayloadBytes and ThroughputPayloadBytes are the datagram
	// sizes of the two measurements.
	LatencyPayloadBytes    int     `json:"latency_payload_bytes"`
	ThroughputPayloadBytes int     `json:"throughput_payload_bytes"`
	RoundTrips             int     `json:"round_trips"`
	DurationSeconds        float64 `json:"duration_seconds"`
}

// DataplanePath is one path's figures.
type DataplanePath struct {
	P50Micros float64 `json:"p50_us"`
	P99Micros float64 `json:"p99_us"`
	// ThroughputMbps is the UDP payload received per second, in 10^6 bits.
	ThroughputMbps    float64 `json:"throughput_mbps"`
	DatagramsReceived uint64  `json:"datagrams_received"`
	DatagramsSent     uint64  `json:"datagrams_sent"`
}

const (
	latencyPayload    = 64
	throughputPayload = 1400 // with UDP/IP headers within the VMs' 1450 MTU
	echoPort          = 7000
	sinkPort          = 7001
)

// RunDataplane builds two hosts as network namespaces on one underlay,
// a VM stand-in on each in VNI 7 (a namespace behind a veth, as the data
// plane's tests use), and measures UDP round trips and throughput from
// one to the other through the eBPF data plane and, in the same run,
// through a plain routed veth path between the same namespaces. Needs root.
func RunDataplane(ctx context.Context, opts DataplaneOptions) (_ *DataplaneReport, err error) {
	if opts.RoundTrips <= 0 {
		opts.RoundTrips = 20000
	}
	if opts.Duration <= 0 {
		opts.Duration = 5 * time.Second
	}
	if os.Geteuid() != 0 {
		return nil, errors.New("tern bench dataplane needs root: it builds network namespaces and loads eBPF programs")
	}
	progress := func(format string, args ...any) {
		if opts.Progress != nil {
			fmt.Fprintf(opts.Progress, format+"\n", args...)
		}
	}
	progress("building two hosts and two VMs in network namespaces")
	lab := nettest.NewLab()
	defer func() { err = errors.Join(err, lab.Close()) }()
	rack, err := nettest.NewRack(lab)
	if err != nil {
		return nil, err
	}
	fs, err := os.MkdirTemp("", "tern-bench-bpffs-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(fs)
	if err := dataplane.MountBPFFS(fs); err != nil {
		return nil, err
	}
	defer unix.Unmount(fs, unix.MNT_DETACH)

	var vms []*nettest.VM
	var planes []*dataplane.Plane
	var table []dataplane.Mapping
	defer func() {
		for i, p := range planes {
			if c, cerr := p.Counters(); cerr == nil {
				progress("host %d counters: %s", i, formatCounters(c))
			}
			err = errors.Join(err, p.Close())
		}
	}()
	for i, name := range []string{"a", "b"} {
		h, err := rack.AddHost(name)
		if err != nil {
			return nil, err
		}
		p, err := dataplane.New(dataplane.Config{Underlay: h.Underlay, PinDir: filepath.Join(fs, name), Netns: h.NS.Path()})
		if err != nil {
			return nil, err
		}
		planes = append(planes, p)
		ip := netip.AddrFrom4([4]byte{10, 7, 0, byte(i + 1)})
		vm, err := rack.AddVM(h, "vm"+name, ip, net.HardwareAddr{0x52, 0x54, 0, 0, 0, byte(i + 1)})
		if err != nil {
			return nil, err
		}
		if err := rack.AddPlainPath(vm, 2); err != nil {
			return nil, err
		}
		if err := p.AttachPort(dataplane.Port{InstanceID: "vm" + name, Device: vm.Device, MAC: vm.MAC, VNI: 7, IP: ip}); err != nil {
			return nil, err
		}
		vms = append(vms, vm)
		table = append(table, dataplane.Mapping{VNI: 7, IP: ip, InstanceID: "vm" + name, Underlay: h.Underlay})
	}
	for _, p := range planes {
		if err := p.Apply(table); err != nil {
			return nil, err
		}
	}
	if err := rack.RoutePlain(); err != nil {
		return nil, err
	}
	return measureDataplane(ctx, opts, vms[0], vms[1], progress)
}

func formatCounters(c dataplane.Counters) string {
	s := ""
	for i, n := range c {
		if n != 0 {
			s += fmt.Sprintf(" %s=%d", dataplane.Counter(i), n)
		}
	}
	return s
}

// measureDataplane times round trips and throughput from client to
// server on both paths: server's VNI address (the eBPF path) and its
// plain address.
func measureDataplane(ctx context.Context, opts DataplaneOptions, client, server *nettest.VM, progress func(string, ...any)) (*DataplaneReport, error) {
	echo, err := server.NS.StartEcho(netip.AddrPortFrom(netip.IPv4Unspecified(), echoPort))
	if err != nil {
		return nil, err
	}
	defer echo.Close()
	paths := []struct {
		name     string
		from, to netip.Addr
		rtts     []time.Duration
		out      *DataplanePath
	}{
		{name: "ebpf", from: client.IP, to: server.IP},
		{name: "plain", from: client.Plain, to: server.Plain},
	}
	rep := &DataplaneReport{LatencyPayloadBytes: latencyPayload, ThroughputPayloadBytes: throughputPayload,
		RoundTrips: opts.RoundTrips, DurationSeconds: opts.Duration.Seconds()}
	paths[0].out, paths[1].out = &rep.EBPF, &rep.Plain
	conns := make([]*net.UDPConn, len(paths))
	for i, p := range paths {
		c, err := client.NS.ListenUDP(netip.AddrPortFrom(p.from, 0))
		if err != nil {
			return nil, err
		}
		defer c.Close()
		conns[i] = c
		// The first exchange also resolves the neighbours.
		if err := nettest.RoundTrip(c, netip.AddrPortFrom(p.to, echoPort), []byte("warm up"), 10*time.Second); err != nil {
			return nil, fmt.Errorf("%s path: %w", p.name, err)
		}
	}
	progress("timing %d UDP round trips of %d bytes on each path", opts.RoundTrips, latencyPayload)
	const blocks = 10
	payload := make([]byte, latencyPayload)
	buf := make([]byte, 2048)
	for b := range blocks {
		for i := range paths {
			p := &paths[i]
			to := netip.AddrPortFrom(p.to, echoPort)
			for range opts.RoundTrips / blocks {
				if err := ctx.Err(); err != nil {
					return nil, err
				}
				start := time.Now()
				if _, err := conns[i].WriteToUDPAddrPort(payload, to); err != nil {
					return nil, err
				}
				conns[i].SetReadDeadline(start.Add(time.Second))
				if _, _, err := conns[i].ReadFromUDPAddrPort(buf); err != nil {
					return nil, fmt.Errorf("%s path, block %d: %w", p.name, b, err)
				}
				p.rtts = append(p.rtts, time.Since(start))
			}
		}
	}
	for i := range paths {
		p := &paths[i]
		slices.Sort(p.rtts)
		p.out.P50Micros = usec(p.rtts[len(p.rtts)/2])
		p.out.P99Micros = usec(p.rtts[len(p.rtts)*99/100])
	}
	// Throughput in slices alternating between the paths, so a neighbour's
	// load on this machine weighs on both alike.
	progress("sending %d-byte datagrams for %v on each path, in %d alternating slices", throughputPayload, opts.Duration, blocks)
	for range blocks {
		for i := range paths {
			p := &paths[i]
			sent, got, err := blast(ctx, client, server, p.from, p.to, opts.Duration/blocks)
			if err != nil {
				return nil, fmt.Errorf("%s path: %w", p.name, err)
			}
			p.out.DatagramsSent += sent
			p.out.DatagramsReceived += got
		}
	}
	for i := range paths {
		p := &paths[i]
		p.out.ThroughputMbps = float64(p.out.DatagramsReceived) * throughputPayload * 8 / opts.Duration.Seconds() / 1e6
	}
	if rep.Plain.ThroughputMbps > 0 {
		rep.ThroughputRatio = rep.EBPF.ThroughputMbps / rep.Plain.ThroughputMbps
	}
	if rep.Plain.P99Micros > 0 {
		rep.P99Ratio = rep.EBPF.P99Micros / rep.Plain.P99Micros
	}
	return rep, nil
}

func usec(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// blast sends datagrams from one VM address to a sink at the other for d
// as fast as one socket can, and counts what the sink received.
func blast(ctx context.Context, client, server *nettest.VM, from, to netip.Addr, d time.Duration) (sent, got uint64, err error) {
	sink, err := server.NS.ListenUDP(netip.AddrPortFrom(to, sinkPort))
	if err != nil {
		return 0, 0, err
	}
	sink.SetReadBuffer(8 << 20)
	var received atomic.Uint64
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 2048)
		for {
			if _, err := sink.Read(buf); err != nil {
				return
			}
			received.Add(1)
		}
	}()
	c, err := client.NS.ListenUDP(netip.AddrPortFrom(from, 0))
	if err != nil {
		sink.Close()
		<-done
		return 0, 0, err
	}
	defer c.Close()
	payload := make([]byte, throughputPayload)
	dst := netip.AddrPortFrom(to, sinkPort)
	end := time.Now().Add(d)
	for time.Now().Before(end) && ctx.Err() == nil {
		for range 64 {
			if _, err := c.WriteToUDPAddrPort(payload, dst); err == nil {
				sent++
			}
		}
	}
	// What is in flight lands within a moment; the sink's count then
	// stops moving. Read it once the count has been still for 100 ms.
	last := received.Load()
	for {
		time.Sleep(100 * time.Millisecond)
		now := received.Load()
		if now == last {
			break
		}
		last = now
	}
	sink.Close()
	<-done
	return sent, received.Load(), ctx.Err()
}

// WriteTable prints the report for people.
func (r *DataplaneReport) WriteTable(w io.Writer) {
	fmt.Fprintf(w, "UDP between two VMs on two hosts: %d round trips of %d bytes, %v of %d-byte datagrams per path\n",
		r.RoundTrips, r.LatencyPayloadBytes, time.Duration(r.DurationSeconds*float64(time.Second)), r.ThroughputPayloadBytes)
	fmt.Fprintf(w, "%-26s %10s %10s %12s\n", "path", "p50 µs", "p99 µs", "Mbit/s")
	fmt.Fprintf(w, "%-26s %10.1f %10.1f %12.0f\n", "eBPF data plane (VXLAN)", r.EBPF.P50Micros, r.EBPF.P99Micros, r.EBPF.ThroughputMbps)
	fmt.Fprintf(w, "%-26s %10.1f %10.1f %12.0f\n", "plain routed veth (limit)", r.Plain.P50Micros, r.Plain.P99Micros, r.Plain.ThroughputMbps)
	fmt.Fprintf(w, "throughput_ratio %.2f (target ≥ 0.8), p99_ratio %.2f (target ≤ 1.25)\n", r.ThroughputRatio, r.P99Ratio)
}
