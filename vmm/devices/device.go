package devices

// PortIO is a device on the x86 IO-port bus. port is the absolute port;
// data holds the bytes written, or receives the bytes read (1, 2 or 4).
type PortIO interface {
	ReadPort(port uint16, data []byte)
	WritePort(port uint16, data []byte)
}

// MMIO is a device on the memory-mapped IO bus. offset is relative to
// the device's base address.
type MMIO interface {
	ReadMMIO(offset uint64, data []byte)
	WriteMMIO(offset uint64, data []byte)
}

// Interrupt raises a device's interrupt line; a KVM irqfd (an eventfd
// write) will implement it. Trigger must not block.
type Interrupt interface {
	Trigger() error
}

// NoInterrupt is an Interrupt that does nothing, for polling guests.
type NoInterrupt struct{}

// Trigger does nothing.
func (NoInterrupt) Trigger() error { return nil }

// littleEndian decodes up to 8 bytes.
func littleEndian(data []byte) uint64 {
	var v uint64
	for i := len(data) - 1; i >= 0; i-- {
		v = v<<8 | uint64(data[i])
	}
	return v
}

// putLittleEndian encodes v into data.
func putLittleEndian(data []byte, v uint64) {
	for i := range data {
		data[i] = byte(v)
		v >>= 8
	}
}
