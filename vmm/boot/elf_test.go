package boot

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"tern/vmm/guests"
	"tern/vmm/memory"
)

func newRAM(t testing.TB, size uint64) *memory.Memory {
	t.Helper()
	m, err := memory.New(memory.RegionSpec{Name: "ram", Size: size})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func TestLoadGuestPlacesEveryBuiltInGuest(t *testing.T) {
	for _, name := range guests.Names() {
		t.Run(name, func(t *testing.T) {
			file, _ := guests.ELF(name)
			m := newRAM(t, 16<<20)
			img, st, err := LoadGuest(m, file)
			if err != nil {
				t.Fatal(err)
			}
			if !img.HasPVH || img.PVHEntry == 0 || uint64(img.PVHEntry) == img.Entry {
				t.Errorf("PVH entry %#x (present %v), 64-bit entry %#x", img.PVHEntry, img.HasPVH, img.Entry)
			}
			if st.RIP != img.Entry {
				t.Errorf("RIP %#x, want the ELF entry %#x", st.RIP, img.Entry)
			}
			// Only smp starts its own application processors.
			if want := name == "smp"; img.LocalAPICs != want {
				t.Errorf("LocalAPICs %v (tern's note), want %v", img.LocalAPICs, want)
			}
			for _, s := range img.Segments {
				got, err := m.Slice(s.Addr, s.MemSize)
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got[:len(s.Data)], s.Data) || !bytes.Equal(got[len(s.Data):], make([]byte, s.MemSize-uint64(len(s.Data)))) {
					t.Errorf("segment at %#x not loaded as file bytes then zeros", uint64(s.Addr))
				}
			}
		})
	}
}

// patched returns a copy of the hello guest with f applied.
func patched(t *testing.T, f func(b []byte)) []byte {
	t.Helper()
	b, err := guests.ELF("hello")
	if err != nil {
		t.Fatal(err)
	}
	b = bytes.Clone(b)
	f(b)
	return b
}

func TestParseELFRejectsWithTypedErrors(t *testing.T) {
	le := binary.LittleEndian
	cases := []struct {
		name string
		file []byte
		want error
	}{
		{"empty", nil, ErrNotELF},
		{"text", []byte("#!/bin/sh\necho hello, this is not an ELF file at all, not even close\n"), ErrNotELF},
		{"32-bit", patched(t, func(b []byte) { b[4] = 1 }), ErrNotELF64},
		{"big-endian", patched(t, func(b []byte) { b[5] = 2 }), ErrNotELF64},
		{"aarch64", patched(t, func(b []byte) { le.PutUint16(b[18:], 183) }), ErrWrongMachine},
		{"shared object", patched(t, func(b []byte) { le.PutUint16(b[16:], 3) }), ErrWrongMachine},
		{"program headers past the end", patched(t, func(b []byte) { le.PutUint64(b[32:], 1<<40) }), ErrBadELF},
		{"no program headers", patched(t, func(b []byte) { le.PutUint16(b[56:], 0) }), ErrBadELF},
		{"entry outside code", patched(t, func(b []byte) { le.PutUint64(b[24:], 0x5000000) }), ErrBadELF},
		{"truncated", patched(t, func(b []byte) {})[:100], ErrBadELF},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := ParseELF(c.file); !errors.Is(err, c.want) {
				t.Errorf("error %v, want %v", err, c.want)
			}
		})
	}
}

func TestLoadELFRejectsSegmentsOutsideRAM(t *testing.T) {
	file, _ := guests.ELF("hello")
	img, err := ParseELF(file)
	if err != nil {
		t.Fatal(err)
	}
	small := newRAM(t, 1<<20) // the guest links at 1 MiB: just past the end
	if err := LoadELF(small, img); !errors.Is(err, ErrOutsideRAM) {
		t.Errorf("error %v, want ErrOutsideRAM", err)
	}
	if b, _ := small.Slice(0, 1<<20); !bytes.Equal(b, make([]byte, 1<<20)) {
		t.Error("a rejected load wrote to guest memory")
	}
}
