package nettest

import (
	"encoding/binary"
	"net"
	"net/netip"
)

// UDPFrame builds an Ethernet frame carrying an IPv4 UDP datagram (UDP
// checksum 0, which IPv4 allows).
func UDPFrame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.AddrPort, payload []byte) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], src.Port())
	binary.BigEndian.PutUint16(udp[2:], dst.Port())
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)

	ip := make([]byte, 20+len(udp))
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(len(ip)))
	ip[8] = 64 // TTL
	ip[9] = 17 // UDP
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	binary.BigEndian.PutUint16(ip[10:], ipChecksum(ip[:20]))
	copy(ip[20:], udp)

	frame := make([]byte, 14+len(ip))
	copy(frame[0:], dstMAC)
	copy(frame[6:], srcMAC)
	binary.BigEndian.PutUint16(frame[12:], 0x0800)
	copy(frame[14:], ip)
	return frame
}

// VXLANPayload is the UDP payload of a VXLAN packet for vni around inner.
func VXLANPayload(vni uint32, inner []byte) []byte {
	b := make([]byte, 8+len(inner))
	b[0] = 0x08 // the VNI is valid
	binary.BigEndian.PutUint32(b[4:], vni<<8)
	copy(b[8:], inner)
	return b
}

func ipChecksum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(h[i:]))
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
