// Package dataplane is the host's network data plane: two eBPF tc
// programs (bpf/v2p.c, compiled by bpf2go; the object is committed) over a
// virtual-to-physical (V2P) map, loaded and attached with cilium/ebpf.
//
// from_guest runs on the ingress of every VM's TAP (what the guest
// sends). It answers the guest's ARP requests for addresses of its own VNI
// with the router MAC, drops any packet whose source is not the guest's
// own address, and looks (VNI of the TAP, destination) up in the V2P map:
// a VM on this host gets the packet redirected to its TAP with its MAC
// written in; a VM on another host gets it through the collect-metadata
// VXLAN device with the tunnel key (VNI, host) set; no entry, a drop.
// from_tunnel runs on the VXLAN device's ingress (what other hosts send):
// the tunnel's VNI and the inner destination must name a VM on this host
// whose port is in that VNI, or, for a VM that moved away, a forwarding
// entry that re-encapsulates toward its new host. Every verdict bumps a
// per-CPU counter (Counters, and /metrics through RegisterMetrics).
//
// Invariants:
//   - A guest's frame never reaches the host's own stack: from_guest
//     drops or redirects every frame (FuzzFromGuest checks it). So a guest
//     cannot send to the underlay, a forged VXLAN packet included.
//   - A packet reaches a TAP only if its VNI (the sender's TAP's, or the
//     tunnel's) is the TAP's own: the map key carries the VNI and the
//     destination's port is checked again.
//   - A table is applied whole (Plane.Apply): validated first, then each
//     changed entry written with one map update (a VM's new host replaces
//     its old one atomically, no key is ever briefly absent), then stale
//     entries deleted.
//   - A VM that stops being local keeps a forwarding entry on this host
//     for Config.ForwardFor after it left (one minute by default: longer
//     than the control plane takes to push every host a table, which it
//     does at once on every change and on every registration) — the
//     control plane has no "every host applied it" signal yet, so the
//     bound is time.
//
// Plane owns the loaded objects, the links and the VXLAN device; Close
// releases them all. The maps are pinned under Config.PinDir (a bpffs) so
// an operator can read them and counters outlive a restart; New clears the
// V2P and port entries a previous plane left.
//
// nettest builds the namespaces the tests and `tern bench dataplane` run
// in; most tests stand a network namespace behind a veth (or a TAP the
// test writes frames to) in for a VM. vmtest runs real VMs (tern's udp
// guest on a virtio-net card) and migrates one across the planes.
package dataplane
