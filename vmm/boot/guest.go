package boot

import "tern/vmm/memory"

// LoadGuest parses and loads a tern test guest (an ELF64 with a 64-bit
// entry) and returns the vCPU state that starts it in long mode.
func LoadGuest(m *memory.Memory, elfFile []byte) (*ELFImage, CPUState, error) {
	img, err := ParseELF(elfFile)
	if err != nil {
		return nil, CPUState{}, err
	}
	if err := LoadELF(m, img); err != nil {
		return nil, CPUState{}, err
	}
	st, err := LongModeState(m, img.Entry)
	if err != nil {
		return nil, CPUState{}, err
	}
	return img, st, nil
}
