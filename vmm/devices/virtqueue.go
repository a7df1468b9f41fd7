package devices

import (
	"encoding/binary"
	"errors"
	"fmt"

	"tern/vmm/memory"
)

// Descriptor flags of a split virtqueue.
const (
	descFNext     = 1
	descFWrite    = 2
	descFIndirect = 4
)

// descSize is the size of one descriptor-table entry.
const descSize = 16

// ErrBadChain reports a descriptor chain that cannot be walked: an index
// out of the table, a loop, or an indirect table (not negotiated). Buffers
// outside guest RAM are not checked here: the device answers those with an
// IO error when it accesses them.
var ErrBadChain = errors.New("bad descriptor chain")

// Desc is one descriptor of a chain.
type Desc struct {
	Addr  memory.GPA
	Len   uint32
	Write bool // device-writable
}

// Virtqueue is the device side of a split virtqueue in guest memory. It
// is used by one goroutine at a time (the queue's processor).
type Virtqueue struct {
	// Immutable after construction.
	mem               *memory.Memory
	size              uint16
	desc, avail, used memory.GPA
	// lastAvail is the next avail-ring entry to consume; usedIdx mirrors
	// the used ring's idx, which only the device writes.
	lastAvail, usedIdx uint16
}

// newVirtqueue checks the rings lie in guest RAM, aligned as virtio 1.x
// requires, and returns the queue.
func newVirtqueue(mem *memory.Memory, size uint16, desc, avail, used memory.GPA) (*Virtqueue, error) {
	if size == 0 || size&(size-1) != 0 {
		return nil, fmt.Errorf("queue size %d is not a power of two", size)
	}
	n := uint64(size)
	for _, r := range []struct {
		what  string
		addr  memory.GPA
		len   uint64
		align uint64
	}{
		{"descriptor table", desc, descSize * n, 16},
		{"available ring", avail, 6 + 2*n, 2},
		{"used ring", used, 6 + 8*n, 4},
	} {
		if uint64(r.addr)%r.align != 0 || !mem.Contains(r.addr, r.len) {
			return nil, fmt.Errorf("%s at %#x (%d bytes) is misaligned or outside guest RAM", r.what, uint64(r.addr), r.len)
		}
	}
	q := &Virtqueue{mem: mem, size: size, desc: desc, avail: avail, used: used}
	idx, err := mem.AtomicUint16(used + 2)
	if err != nil {
		return nil, err
	}
	q.usedIdx = idx
	q.lastAvail = idx
	return q, nil
}

// Pop returns the head of the next available chain, if any.
func (q *Virtqueue) Pop() (head uint16, ok bool, err error) {
	availIdx, err := q.mem.AtomicUint16(q.avail + 2)
	if err != nil {
		return 0, false, err
	}
	if availIdx == q.lastAvail {
		return 0, false, nil
	}
	head, err = q.mem.AtomicUint16(q.avail + 4 + 2*memory.GPA(q.lastAvail%q.size))
	if err != nil {
		return 0, false, err
	}
	q.lastAvail++
	return head, true, nil
}

// Chain reads the descriptor chain starting at head. It fails with
// ErrBadChain on an out-of-range index, a loop (more descriptors than the
// queue size) or an indirect descriptor.
func (q *Virtqueue) Chain(head uint16) ([]Desc, error) { return q.AppendChain(nil, head) }

// AppendChain is Chain appending to dst[:0], so that a device serving
// one chain at a time reuses one slice.
func (q *Virtqueue) AppendChain(dst []Desc, head uint16) ([]Desc, error) {
	chain := dst[:0]
	var raw [descSize]byte
	for i := head; ; {
		if i >= q.size {
			return nil, fmt.Errorf("%w: index %d beyond queue size %d", ErrBadChain, i, q.size)
		}
		if len(chain) >= int(q.size) {
			return nil, fmt.Errorf("%w: loop", ErrBadChain)
		}
		if err := q.mem.Read(q.desc+memory.GPA(i)*descSize, raw[:]); err != nil {
			return nil, err
		}
		d := Desc{
			Addr: memory.GPA(binary.LittleEndian.Uint64(raw[0:])),
			Len:  binary.LittleEndian.Uint32(raw[8:]),
		}
		flags := binary.LittleEndian.Uint16(raw[12:])
		if flags&descFIndirect != 0 {
			return nil, fmt.Errorf("%w: indirect descriptor not negotiated", ErrBadChain)
		}
		d.Write = flags&descFWrite != 0
		chain = append(chain, d)
		if flags&descFNext == 0 {
			return chain, nil
		}
		i = binary.LittleEndian.Uint16(raw[14:])
	}
}

// PushUsed returns the chain at head to the driver, with written bytes
// written into its device-writable buffers. The entry is published before
// the index, both with atomic stores.
func (q *Virtqueue) PushUsed(head uint16, written uint32) error {
	elem := q.used + 4 + 8*memory.GPA(q.usedIdx%q.size)
	if err := q.mem.AtomicPutUint32(elem, uint32(head)); err != nil {
		return err
	}
	if err := q.mem.AtomicPutUint32(elem+4, written); err != nil {
		return err
	}
	q.usedIdx++
	return q.mem.AtomicPutUint16(q.used+2, q.usedIdx)
}
