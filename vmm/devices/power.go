package devices

import "sync"

// The power registers of a Linux guest's hardware-reduced ACPI machine,
// one I/O port each; the FADT names them (vmm/acpi Spec.Power), and the
// DSDT's \_S5 object gives the sleep type poweroff writes.
const (
	// SleepControlPort is the FADT's SLEEP_CONTROL_REG: the kernel enters
	// a sleep state by writing its type (bits 4:2) with SLP_EN (bit 5).
	SleepControlPort = 0x600
	// SleepStatusPort is SLEEP_STATUS_REG: it reads as no wake event;
	// writes (the kernel clears WAK_STS before sleeping) are ignored.
	SleepStatusPort = 0x601
	// ResetPort is RESET_REG; writing ResetValue to it resets the machine.
	ResetPort  = 0x602
	ResetValue = 0x01
	// SleepTypeS5 is the sleep type of soft-off, \_S5's value.
	SleepTypeS5 = 5
	// KeyboardCommandPort is the i8042 keyboard controller's command
	// port; its pulse-reset command (KeyboardResetCommand) resets the
	// machine, as on a PC. Linux tries it when the ACPI reset did not
	// reset (and first with reboot=k, Firecracker's advice); the
	// controller is otherwise absent (reads as idle, no data).
	KeyboardCommandPort  = 0x64
	KeyboardResetCommand = 0xfe
	// PowerPorts is how many ports from SleepControlPort the device takes.
	PowerPorts = 3
)

// Sleep-control register bits (ACPI 6.4, 4.8.3.7).
const (
	sleepTypeShift = 2
	sleepTypeMask  = 7 << sleepTypeShift
	sleepEnable    = 1 << 5
)

// PowerEvent is what the guest asked of the machine through its power
// registers.
type PowerEvent int

const (
	// PowerNone: nothing yet.
	PowerNone PowerEvent = iota
	// PowerOff: the guest entered S5 (Linux's poweroff).
	PowerOff
	// PowerReset: the guest wrote the reset value (Linux's reboot).
	PowerReset
)

func (e PowerEvent) String() string {
	switch e {
	case PowerOff:
		return "power off"
	case PowerReset:
		return "reset"
	}
	return "none"
}

// Power is the sleep-control, sleep-status and reset registers at
// SleepControlPort: the first power-off or reset the guest asks for is
// recorded and closes Done; what follows is ignored. A write of another
// sleep type, or of a value other than ResetValue to the reset register,
// changes nothing (no other sleep state is offered).
type Power struct {
	// Immutable after construction.
	done chan struct{}
	once sync.Once
	// ev is written once, before done is closed.
	ev PowerEvent
}

// NewPower returns the power registers.
func NewPower() *Power { return &Power{done: make(chan struct{})} }

// Done is closed when the guest has powered off or reset.
func (p *Power) Done() <-chan struct{} { return p.done }

// Event returns what the guest asked for, PowerNone before Done.
func (p *Power) Event() PowerEvent {
	select {
	case <-p.done:
		return p.ev
	default:
		return PowerNone
	}
}

// ReadPort reads zeros: no wake event, the write-only registers read as
// nothing, and the keyboard controller's status says its input buffer is
// empty (the kernel waits for that before its reset command).
func (p *Power) ReadPort(_ uint16, data []byte) { clear(data) }

// WritePort decodes a write to one of the registers.
func (p *Power) WritePort(port uint16, data []byte) { p.Write(port, data) }

// Write is WritePort that reports whether the write ended the machine
// (the VMM then stops its vCPUs before the writer runs on).
func (p *Power) Write(port uint16, data []byte) bool {
	if len(data) == 0 {
		return false
	}
	v := data[0]
	ev := PowerNone
	switch port {
	case SleepControlPort:
		if v&sleepEnable != 0 && (v&sleepTypeMask)>>sleepTypeShift == SleepTypeS5 {
			ev = PowerOff
		}
	case ResetPort:
		if v == ResetValue {
			ev = PowerReset
		}
	case KeyboardCommandPort:
		if v == KeyboardResetCommand {
			ev = PowerReset
		}
	}
	if ev == PowerNone {
		return false
	}
	p.once.Do(func() {
		p.ev = ev
		close(p.done)
	})
	return true
}
