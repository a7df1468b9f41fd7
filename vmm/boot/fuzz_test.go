package boot

import (
	"testing"

	"tern/vmm/guests"
)

func FuzzParseELF(f *testing.F) {
	for _, name := range guests.Names() {
		b, _ := guests.ELF(name)
		f.Add(b)
	}
	f.Add([]byte("\x7fELF\x02\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		img, err := ParseELF(b)
		if err != nil {
			return
		}
		// Whatever parses must load or be refused cleanly.
		_ = LoadELF(newRAM(t, 2<<20), img)
	})
}

func FuzzParseBzImage(f *testing.F) {
	f.Add(syntheticBzImage(512))
	f.Add(syntheticBzImage(0)[:0x300])
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseBzImage(b)
		if err != nil {
			return
		}
		_, _ = BootParams(h, uint64(CmdlineAddr), 0, 0, nil)
		_, _ = LoadLinux(newRAM(t, 2<<20), b, []byte{1}, "x")
	})
}
