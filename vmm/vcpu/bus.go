package vcpu

import (
	"fmt"
	"sort"
	"sync"

	"tern/vmm/devices"
)

// addrRange is one registered range of a bus: [base, base+size).
type addrRange[D any] struct {
	name string
	base uint64
	size uint64
	dev  D
}

func (r addrRange[D]) end() uint64 { return r.base + r.size }

func (r addrRange[D]) String() string {
	return fmt.Sprintf("%s [%#x, %#x)", r.name, r.base, r.end())
}

// ranges is a sorted set of non-overlapping ranges.
type ranges[D any] struct {
	mu   sync.RWMutex
	list []addrRange[D] // guarded by mu; sorted by base
}

func (rs *ranges[D]) register(name string, base, size, limit uint64, dev D) error {
	r := addrRange[D]{name: name, base: base, size: size, dev: dev}
	if size == 0 || base > limit || size-1 > limit-base {
		return fmt.Errorf("registering %v: range empty or past %#x", r, limit)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, o := range rs.list {
		if r.base < o.end() && o.base < r.end() {
			return fmt.Errorf("registering %v: overlaps %v", r, o)
		}
	}
	rs.list = append(rs.list, r)
	sort.Slice(rs.list, func(i, j int) bool { return rs.list[i].base < rs.list[j].base })
	return nil
}

// find returns the range holding all of [addr, addr+n).
func (rs *ranges[D]) find(addr, n uint64) (addrRange[D], bool) {
	rs.mu.RLock()
	defer rs.mu.RUnlock()
	i := sort.Search(len(rs.list), func(i int) bool { return rs.list[i].base > addr }) - 1
	if i < 0 {
		return addrRange[D]{}, false
	}
	r := rs.list[i]
	if addr-r.base >= r.size || n > r.size-(addr-r.base) {
		return addrRange[D]{}, false
	}
	return r, true
}

// PortBus maps x86 IO-port ranges to devices. Devices receive the
// absolute port.
type PortBus struct{ r ranges[devices.PortIO] }

// Register claims ports [base, base+count) for dev; name appears in
// errors. A range that overlaps one already registered is an error.
func (b *PortBus) Register(name string, base, count uint16, dev devices.PortIO) error {
	return b.r.register(name, uint64(base), uint64(count), 0xffff, dev)
}

// Read dispatches an IN of len(data) bytes at port; unclaimed ports read
// as all ones.
func (b *PortBus) Read(port uint16, data []byte) {
	if r, ok := b.r.find(uint64(port), uint64(len(data))); ok {
		r.dev.ReadPort(port, data)
		return
	}
	for i := range data {
		data[i] = 0xff
	}
}

// Write dispatches an OUT of data at port; unclaimed ports drop it.
func (b *PortBus) Write(port uint16, data []byte) {
	if r, ok := b.r.find(uint64(port), uint64(len(data))); ok {
		r.dev.WritePort(port, data)
	}
}

// MMIOBus maps guest-physical address ranges to devices. Devices receive
// the offset from their range's base.
type MMIOBus struct{ r ranges[devices.MMIO] }

// Register claims [base, base+size) for dev; name appears in errors. A
// range that overlaps one already registered is an error.
func (b *MMIOBus) Register(name string, base, size uint64, dev devices.MMIO) error {
	return b.r.register(name, base, size, ^uint64(0), dev)
}

// Read dispatches a read of len(data) bytes at addr; unclaimed addresses
// read as zeros.
func (b *MMIOBus) Read(addr uint64, data []byte) {
	if r, ok := b.r.find(addr, uint64(len(data))); ok {
		r.dev.ReadMMIO(addr-r.base, data)
		return
	}
	clear(data)
}

// Write dispatches a write of data at addr; unclaimed addresses drop it.
func (b *MMIOBus) Write(addr uint64, data []byte) {
	if r, ok := b.r.find(addr, uint64(len(data))); ok {
		r.dev.WriteMMIO(addr-r.base, data)
	}
}
