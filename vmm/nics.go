package vmm

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net"

	"tern/vmm/devices"
	"tern/vmm/tap"
)

// NIC is one virtio-net network card of a VM, on a TAP interface of the
// host.
type NIC struct {
	// TAP is the host interface's name. The VM attaches to it when built
	// (creating it, down, if there is none: see vmm/tap) and closes it
	// with itself.
	TAP string
	// MAC is the card's address, a unicast one; nil means NICMAC(TAP).
	MAC net.HardwareAddr
}

// NICMAC is the address a card on tapName gets when none is given: the
// 52:54:00 prefix QEMU and libvirt use (locally administered, unicast)
// and three bytes of a hash of the name, so the same name always gives
// the same address.
func NICMAC(tapName string) net.HardwareAddr {
	h := sha256.Sum256([]byte("tern nic " + tapName))
	return net.HardwareAddr{0x52, 0x54, 0x00, h[0], h[1], h[2]}
}

// mac is the card's address.
func (n NIC) mac() net.HardwareAddr {
	if n.MAC == nil {
		return NICMAC(n.TAP)
	}
	return n.MAC
}

// ValidateMAC checks mac is an address a network card may have: six
// bytes, unicast, not all zero.
func ValidateMAC(mac net.HardwareAddr) error {
	switch {
	case len(mac) != 6:
		return fmt.Errorf("MAC %v is %d bytes; want 6", mac, len(mac))
	case mac[0]&1 != 0:
		return fmt.Errorf("MAC %v is a multicast address", mac)
	case string(mac) == string(make([]byte, 6)):
		return fmt.Errorf("MAC %v is all zero", mac)
	}
	return nil
}

// validateNICs checks the network cards: how many, their TAP names and
// addresses, none twice.
func (c *Config) validateNICs() []error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if len(c.NICs) > MaxNICs {
		bad("nics: %d given, at most %d", len(c.NICs), MaxNICs)
	}
	taps, macs := map[string]int{}, map[string]int{}
	for j, n := range c.NICs {
		if err := tap.ValidName(n.TAP); err != nil {
			bad("nics[%d]: %v", j, err)
		} else if k, dup := taps[n.TAP]; dup {
			bad("nics[%d]: tap %s is nics[%d]'s too", j, n.TAP, k)
		} else {
			taps[n.TAP] = j
		}
		if err := ValidateMAC(n.mac()); err != nil {
			bad("nics[%d]: %v", j, err)
		} else if k, dup := macs[n.mac().String()]; dup {
			bad("nics[%d]: MAC %v is nics[%d]'s too", j, n.mac(), k)
		} else {
			macs[n.mac().String()] = j
		}
	}
	return errs
}

// attachNICs opens each card's TAP and puts a virtio-net device in its
// slot, NICSlot(j). A Linux guest's card interrupts through an irqfd on
// its slot's GSI and its queues are notified through ioeventfds, as a
// disk's (virtio_irq.go); tern's own guests poll.
func (vm *VM) attachNICs(cfg Config) error {
	for j, n := range cfg.NICs {
		slot := NICSlot(j)
		var irq devices.Interrupt = devices.NoInterrupt{}
		var notifiers devices.Notifiers
		if cfg.Linux != nil {
			fd, err := newIRQFD(vm.kvm, VirtioSlotGSI(slot))
			if err != nil {
				return fmt.Errorf("wiring network card %d's interrupt: %w", j, err)
			}
			vm.irqfds = append(vm.irqfds, fd)
			irq = fd
			notifiers = ioeventfdNotifiers{vm: vm.kvm, addr: VirtioSlotAddr(slot) + devices.QueueNotifyOffset}
		}
		backend, err := tap.Open(n.TAP)
		if err != nil {
			return fmt.Errorf("attaching network card %d: %w", j, err)
		}
		dev, err := devices.NewAsyncVirtioNet(backend, n.mac(), vm.mem, irq, notifiers)
		if err != nil {
			backend.Close()
			return fmt.Errorf("attaching network card %d: %w", j, err)
		}
		vm.nics = append(vm.nics, dev)
		if err := vm.mmio.Register("virtio-net "+n.TAP, VirtioSlotAddr(slot), devices.MMIOSize, dev.Transport()); err != nil {
			return fmt.Errorf("attaching network card %d: %w", j, err)
		}
	}
	return nil
}

// virtioTransports returns every virtio transport, in slot order: the
// disks', then the network cards'.
func (vm *VM) virtioTransports() []*devices.VirtioMMIO {
	ts := append([]*devices.VirtioMMIO(nil), vm.virtioBlks...)
	for _, n := range vm.nics {
		ts = append(ts, n.Transport())
	}
	return ts
}

// VirtioNets returns the network cards in slot order (for migration:
// each one's Transport has the virtio-mmio state).
func (vm *VM) VirtioNets() []*devices.VirtioNet { return vm.nics }

// pauseNICs stops the cards writing received frames into guest memory.
func (vm *VM) pauseNICs() {
	for _, n := range vm.nics {
		n.Pause()
	}
}

// resumeNICs lets the cards receive again.
func (vm *VM) resumeNICs() {
	for _, n := range vm.nics {
		n.Resume()
	}
}

// closeNICs stops the cards' receive goroutines and queue workers
// (deassigning their ioeventfds) and closes their TAPs; before the KVM VM
// and guest memory go.
func (vm *VM) closeNICs() error {
	var errs []error
	for _, n := range vm.nics {
		errs = append(errs, n.Close())
	}
	return errors.Join(errs...)
}
