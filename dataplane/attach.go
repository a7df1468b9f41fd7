package dataplane

import (
	"errors"
	"fmt"
	"runtime"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// attachment is a program attached to a device's ingress.
type attachment interface{ Close() error }

// attach puts prog on the ingress of the device with ifindex: a TCX link,
// or a tc clsact filter where TCX is missing (or asked for).
func (p *Plane) attach(ifindex int, prog *ebpf.Program, name string) (attachment, error) {
	if p.cfg.Attach != AttachTC {
		var l link.Link
		err := p.inNetns(func() (err error) {
			l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: ebpf.AttachTCXIngress})
			return err
		})
		if err == nil {
			return l, nil
		}
		if p.cfg.Attach == AttachTCX || !errors.Is(err, ebpf.ErrNotSupported) {
			return nil, fmt.Errorf("attaching a tcx link: %w", err)
		}
		p.log.Info("no tcx on this kernel: attaching with a tc filter", "ifindex", ifindex)
	}
	return attachTCFilter(p.nl, ifindex, prog, name)
}

// tcFilter is a direct-action bpf filter on a clsact qdisc's ingress.
type tcFilter struct {
	nl     *netlink.Handle
	filter *netlink.BpfFilter
}

func attachTCFilter(nl *netlink.Handle, ifindex int, prog *ebpf.Program, name string) (attachment, error) {
	qdisc := &netlink.GenericQdisc{QdiscType: "clsact",
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}}
	if err := nl.QdiscReplace(qdisc); err != nil {
		return nil, fmt.Errorf("adding a clsact qdisc: %w", err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: netlink.HANDLE_MIN_INGRESS,
			Handle: netlink.MakeHandle(0, 1), Protocol: unix.ETH_P_ALL, Priority: 1},
		Fd: prog.FD(), Name: name, DirectAction: true}
	if err := nl.FilterReplace(f); err != nil {
		return nil, fmt.Errorf("adding a bpf filter: %w", err)
	}
	return &tcFilter{nl: nl, filter: f}, nil
}

func (t *tcFilter) Close() error {
	err := t.nl.FilterDel(t.filter)
	if errors.Is(err, unix.ENODEV) || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
		return nil // the device (and its filters) is gone
	}
	if err != nil {
		return fmt.Errorf("removing a bpf filter: %w", err)
	}
	return nil
}

// inNetns runs fn on a thread in the plane's network namespace (the
// namespace TCX resolves an ifindex in is the calling thread's).
func (p *Plane) inNetns(fn func() error) error {
	if !p.ns.IsOpen() {
		return fn()
	}
	return runInNetns(p.ns, fn)
}

func runInNetns(ns netns.NsHandle, fn func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("reading the thread's network namespace: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("entering a network namespace: %w", err)
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and ends with this goroutine
		done <- err
	}()
	return <-done
}
