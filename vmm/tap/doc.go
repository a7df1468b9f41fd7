// Package tap opens Linux TAP interfaces, the host side of a VM's network
// card: one Ethernet frame per read or write, no packet-information
// prefix (IFF_TAP|IFF_NO_PI) and no virtio-net header (no IFF_VNET_HDR,
// because tern's virtio-net offers no offloads).
//
// Invariants:
//   - The TUNSETIFF ioctl and everything else of /dev/net/tun is here and
//     nowhere else in tern.
//   - A Device owns its file descriptor: non-blocking, in the Go runtime's
//     poller, so a blocked ReadFrame ends with ErrClosed when Close runs
//     on another goroutine.
//   - Open attaches to the interface of that name in the caller's network
//     namespace, creating it when there is none. A created interface is
//     not persistent (it goes with the last descriptor) and starts down;
//     bringing an interface up and onto a bridge is the host's network
//     configuration (`ip tuntap add mode tap NAME`, `ip link set NAME up
//     master BRIDGE`), not tern's.
package tap
