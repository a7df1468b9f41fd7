package dataplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Defaults of Config.
const (
	DefaultDevice     = "tern-vx0"
	DefaultVXLANPort  = 4789
	DefaultForwardFor = time.Minute
)

// DefaultRouterMAC is the MAC every guest sees its peers behind: "tern"
// in a locally administered unicast address.
var DefaultRouterMAC = net.HardwareAddr{0x02, 't', 'e', 'r', 'n', 0x00}

// AttachMode says how programs are attached to devices.
type AttachMode int

const (
	// AttachAuto uses TCX and falls back to tc clsact filters on a
	// kernel without TCX (before 6.6).
	AttachAuto AttachMode = iota
	// AttachTCX uses TCX links only.
	AttachTCX
	// AttachTC uses a clsact qdisc and a direct-action bpf filter.
	AttachTC
)

// Config configures a Plane.
type Config struct {
	// Underlay is this host's underlay IPv4: a mapping to it is local.
	Underlay netip.Addr
	// PinDir is a directory on a bpffs mount (created if missing) where
	// the maps are pinned; an operator can read them there, and the
	// counters outlive the process.
	PinDir string
	// Netns is the path of the network namespace the plane works in
	// (devices, VXLAN socket); "" is the caller's.
	Netns string
	// Device names the collect-metadata VXLAN device the plane creates
	// (DefaultDevice); VXLANPort is its UDP port (DefaultVXLANPort).
	Device    string
	VXLANPort uint16
	// RouterMAC is the source MAC of every frame delivered to a guest
	// and the answer to its ARP requests (DefaultRouterMAC).
	RouterMAC net.HardwareAddr
	Attach    AttachMode
	// ForwardFor is how long this host keeps re-encapsulating packets for
	// a VM that moved away (DefaultForwardFor); negative turns it off.
	ForwardFor time.Duration
	Logger     *slog.Logger
}

func (c *Config) fill() error {
	var errs []error
	if !c.Underlay.Is4() {
		errs = append(errs, fmt.Errorf("underlay %v: want an IPv4 address", c.Underlay))
	}
	if c.PinDir == "" {
		errs = append(errs, errors.New("no pin directory"))
	}
	if c.Device == "" {
		c.Device = DefaultDevice
	}
	if len(c.Device) >= 16 {
		errs = append(errs, fmt.Errorf("device name %q: at most 15 bytes", c.Device))
	}
	if c.VXLANPort == 0 {
		c.VXLANPort = DefaultVXLANPort
	}
	if c.RouterMAC == nil {
		c.RouterMAC = DefaultRouterMAC
	}
	if len(c.RouterMAC) != 6 {
		errs = append(errs, fmt.Errorf("router mac %v: want 6 bytes", c.RouterMAC))
	}
	if c.Attach < AttachAuto || c.Attach > AttachTC {
		errs = append(errs, fmt.Errorf("attach mode %d unknown", c.Attach))
	}
	if c.ForwardFor == 0 {
		c.ForwardFor = DefaultForwardFor
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return errors.Join(errs...)
}

// Plane is one host's eBPF data plane: the loaded programs and pinned
// maps, the VXLAN device, the ports (VM interfaces) with from_guest on
// them and the applied mapping table. Close releases all of it but the
// pinned maps.
type Plane struct {
	// Immutable after New.
	cfg    Config
	log    *slog.Logger
	ns     netns.NsHandle // -1 when the plane works in the caller's namespace
	nl     *netlink.Handle
	objs   v2pObjects
	vxlan  netlink.Link
	tunnel attachment
	// stop ends the forwarding reaper, which closes reaped; wake (one
	// slot) tells it the deadlines changed.
	stop   context.CancelFunc
	reaped chan struct{}
	wake   chan struct{}

	mu     sync.Mutex
	closed bool
	// table is the last mapping table applied.
	table []Mapping
	// ports are the attached VM interfaces by instance, links their
	// programs' attachments.
	ports map[string]attachedPort
	links map[string]attachment
	// prev is the V2P map last asked for (no flags), leftAt when each VM
	// that moved away stopped being local (see plan).
	prev   map[v2pV2pKey]v2pV2pValue
	leftAt map[v2pV2pKey]time.Time
}

// New loads the programs, pins their maps under cfg.PinDir, creates the
// VXLAN device (replacing a VXLAN device of that name) and attaches
// from_tunnel to it. The maps' entries are cleared: they name devices of
// a previous plane whose programs went with it.
func New(cfg Config) (_ *Plane, err error) {
	if err := cfg.fill(); err != nil {
		return nil, fmt.Errorf("configuring the data plane: %w", err)
	}
	p := &Plane{cfg: cfg, log: cfg.Logger.With("component", "dataplane"), ns: -1, reaped: make(chan struct{}),
		wake: make(chan struct{}, 1), ports: map[string]attachedPort{}, links: map[string]attachment{},
		prev: map[v2pV2pKey]v2pV2pValue{}, leftAt: map[v2pV2pKey]time.Time{}}
	defer func() {
		if err != nil {
			p.release()
		}
	}()
	// Only rtnetlink: a handle of every family opens NETLINK_XFRM too,
	// which Debian's 6.1 kernel has only once xfrm_user is loaded
	// ("protocol not supported"), and links, qdiscs and filters are all
	// the plane asks of netlink.
	if cfg.Netns != "" {
		if p.ns, err = netns.GetFromPath(cfg.Netns); err != nil {
			return nil, fmt.Errorf("opening network namespace %s: %w", cfg.Netns, err)
		}
		p.nl, err = netlink.NewHandleAt(p.ns, unix.NETLINK_ROUTE)
	} else {
		p.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, fmt.Errorf("opening netlink: %w", err)
	}
	if p.vxlan, err = p.createVXLAN(); err != nil {
		return nil, err
	}
	if err := p.load(); err != nil {
		return nil, err
	}
	if p.tunnel, err = p.attach(p.vxlan.Attrs().Index, p.objs.FromTunnel, "tern_from_tunnel"); err != nil {
		return nil, fmt.Errorf("attaching to %s: %w", cfg.Device, err)
	}
	ctx, stop := context.WithCancel(context.Background())
	p.stop = stop
	go p.reap(ctx)
	return p, nil
}

func (p *Plane) createVXLAN() (netlink.Link, error) {
	if old, err := p.nl.LinkByName(p.cfg.Device); err == nil {
		if _, ok := old.(*netlink.Vxlan); !ok {
			return nil, fmt.Errorf("device %s exists and is a %s, not vxlan", p.cfg.Device, old.Type())
		}
		if err := p.nl.LinkDel(old); err != nil {
			return nil, fmt.Errorf("removing the old %s: %w", p.cfg.Device, err)
		}
	}
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: p.cfg.Device}, FlowBased: true, Port: int(p.cfg.VXLANPort)}
	if err := p.nl.LinkAdd(vx); err != nil {
		return nil, fmt.Errorf("creating vxlan device %s: %w", p.cfg.Device, err)
	}
	link, err := p.nl.LinkByName(p.cfg.Device)
	if err == nil {
		err = p.nl.LinkSetUp(link)
	}
	if err != nil {
		p.nl.LinkDel(vx)
		return nil, fmt.Errorf("bringing up %s: %w", p.cfg.Device, err)
	}
	return link, nil
}

func (p *Plane) load() error {
	spec, err := loadV2p()
	if err != nil {
		return fmt.Errorf("reading the programs: %w", err)
	}
	if err := spec.Variables[v2pVarVxlanIfindex].Set(uint32(p.vxlan.Attrs().Index)); err != nil {
		return fmt.Errorf("setting vxlan_ifindex: %w", err)
	}
	if err := spec.Variables[v2pVarRouterMac].Set([6]byte(p.cfg.RouterMAC)); err != nil {
		return fmt.Errorf("setting router_mac: %w", err)
	}
	if err := os.MkdirAll(p.cfg.PinDir, 0o700); err != nil {
		return fmt.Errorf("creating pin directory: %w", err)
	}
	err = spec.LoadAndAssign(&p.objs, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: p.cfg.PinDir}})
	if err != nil {
		return fmt.Errorf("loading the programs (maps pinned under %s, which must be on a bpffs mount): %w", p.cfg.PinDir, err)
	}
	for _, m := range []*ebpf.Map{p.objs.V2p, p.objs.Ports} {
		if err := clearMap(m); err != nil {
			return err
		}
	}
	return nil
}

func clearMap(m *ebpf.Map) error {
	var keys [][]byte
	var k []byte
	it := m.Iterate()
	for it.Next(&k, new([]byte)) {
		keys = append(keys, slices.Clone(k))
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading map %s: %w", m, err)
	}
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("clearing map %s: %w", m, err)
		}
	}
	return nil
}

// Close detaches every program, removes the VXLAN device and stops the
// plane's goroutine. The pinned maps stay.
func (p *Plane) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.stop()
	<-p.reaped
	return p.release()
}

// release frees whatever New got so far.
func (p *Plane) release() error {
	var errs []error
	for id, l := range p.links {
		errs = append(errs, l.Close())
		delete(p.links, id)
	}
	if p.tunnel != nil {
		errs = append(errs, p.tunnel.Close())
	}
	if p.vxlan != nil {
		if err := p.nl.LinkDel(p.vxlan); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", p.cfg.Device, err))
		}
	}
	errs = append(errs, p.objs.Close())
	if p.nl != nil {
		p.nl.Close()
	}
	if p.ns.IsOpen() {
		p.ns.Close()
	}
	return errors.Join(errs...)
}

// Apply makes table the host's mapping table. It is validated whole
// first (a bad table changes nothing); then every changed entry is
// written with one map update (so a VM's new location replaces the old
// atomically), and only then are stale entries deleted.
func (p *Plane) Apply(table []Mapping) error {
	if err := validateTable(table); err != nil {
		return fmt.Errorf("applying the mapping table: %w: %w", ErrBadTable, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.table = slices.Clone(table)
	return p.syncLocked(time.Now())
}

// ErrBadTable is wrapped by Apply's error for a table it refuses whole.
var ErrBadTable = errors.New("bad mapping table")

// ErrClosed is returned by a Plane's methods after Close.
var ErrClosed = errors.New("data plane closed")

// ErrPortExists is returned by AttachPort for an instance that has a port.
var ErrPortExists = errors.New("instance already has a port")

// AttachPort attaches from_guest to the VM interface port.Device and
// registers the guest behind it; the VM gets its local entry as soon as
// the table maps it to this host. A migration's target attaches its port
// before the switch, so nothing waits on it then.
func (p *Plane) AttachPort(port Port) (err error) {
	if err := port.validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if _, ok := p.ports[port.InstanceID]; ok {
		return fmt.Errorf("attaching a port for %s: %w", port.InstanceID, ErrPortExists)
	}
	link, err := p.nl.LinkByName(port.Device)
	if err != nil {
		return fmt.Errorf("finding device %s: %w", port.Device, err)
	}
	ifindex := uint32(link.Attrs().Index)
	if err := p.objs.Ports.Update(ifindex, v2pPort{Vni: port.VNI, Ip: wireIP(port.IP), Mac: [6]byte(port.MAC)}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("registering port %s: %w", port.Device, err)
	}
	att, err := p.attach(int(ifindex), p.objs.FromGuest, "tern_from_guest")
	if err != nil {
		p.objs.Ports.Delete(ifindex)
		return fmt.Errorf("attaching to %s: %w", port.Device, err)
	}
	port.MAC = slices.Clone(port.MAC)
	p.ports[port.InstanceID] = attachedPort{Port: port, ifindex: ifindex}
	p.links[port.InstanceID] = att
	return p.syncLocked(time.Now())
}

// DetachPort removes an instance's port: its local entry goes first (and,
// if the table then maps it elsewhere, it becomes a forwarding entry),
// then the program is detached.
func (p *Plane) DetachPort(instanceID string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	port, ok := p.ports[instanceID]
	if !ok {
		return nil
	}
	delete(p.ports, instanceID)
	err := p.syncLocked(time.Now())
	if l := p.links[instanceID]; l != nil {
		err = errors.Join(err, l.Close())
		delete(p.links, instanceID)
	}
	if derr := p.objs.Ports.Delete(port.ifindex); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
		err = errors.Join(err, fmt.Errorf("unregistering port %s: %w", port.Device, derr))
	}
	return err
}

// syncLocked brings the kernel's V2P map to what the table and ports ask.
func (p *Plane) syncLocked(now time.Time) error {
	desired := desiredEntries(p.table, p.cfg.Underlay, p.ports)
	current, err := p.readV2P()
	if err != nil {
		return err
	}
	for _, u := range plan(p.prev, desired, current, p.leftAt, now, p.cfg.ForwardFor) {
		if u.del {
			err = p.objs.V2p.Delete(u.key)
			if errors.Is(err, ebpf.ErrKeyNotExist) {
				err = nil
			}
		} else {
			err = p.objs.V2p.Update(u.key, u.val, ebpf.UpdateAny)
		}
		if err != nil {
			return fmt.Errorf("updating the v2p map (vni %d ip %v): %w", u.key.Vni, addrFromWire(u.key.Ip), err)
		}
		if u.val.Flags&v2pForward != 0 {
			p.log.Info("forwarding a moved VM", "vni", u.key.Vni, "ip", addrFromWire(u.key.Ip), "to", addrFromHost(u.val.Host))
		}
	}
	p.prev = desired
	select {
	case p.wake <- struct{}{}:
	default:
	}
	return nil
}

func (p *Plane) readV2P() (map[v2pV2pKey]v2pV2pValue, error) {
	out := map[v2pV2pKey]v2pV2pValue{}
	var k v2pV2pKey
	var v v2pV2pValue
	it := p.objs.V2p.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading the v2p map: %w", err)
	}
	return out, nil
}

// reap ends forwarding entries when their time is up.
func (p *Plane) reap(ctx context.Context) {
	defer close(p.reaped)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		p.mu.Lock()
		end, ok := nextDeadline(p.leftAt, p.cfg.ForwardFor)
		p.mu.Unlock()
		wait := time.Hour
		if ok {
			wait = max(time.Until(end), 0)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		case <-timer.C:
			p.mu.Lock()
			if err := p.syncLocked(time.Now()); err != nil {
				p.log.Error("ending forwarding entries", "err", err)
			}
			p.mu.Unlock()
		}
	}
}

// Entry is one V2P map entry as the kernel holds it.
type Entry struct {
	VNI      uint32
	IP       netip.Addr
	Underlay netip.Addr
	// Ifindex is the local VM's interface, 0 for a VM on another host;
	// Forwarding is set for a VM that moved away and is still followed.
	Ifindex    uint32
	Forwarding bool
}

// Entries reads the kernel's V2P map.
func (p *Plane) Entries() ([]Entry, error) {
	m, err := p.readV2P()
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(m))
	for k, v := range m {
		out = append(out, Entry{VNI: k.Vni, IP: addrFromWire(k.Ip), Underlay: addrFromHost(v.Host), Ifindex: v.Ifindex,
			Forwarding: v.Flags&v2pForward != 0})
	}
	slices.SortFunc(out, func(a, b Entry) int {
		if a.VNI != b.VNI {
			return int(a.VNI) - int(b.VNI)
		}
		return a.IP.Compare(b.IP)
	})
	return out, nil
}
