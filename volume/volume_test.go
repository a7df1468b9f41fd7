package volume

import (
	"bytes"
	"context"
	"errors"
	"testing"
)

func TestWriteZeroesAsWritesZeroesTheRangeOnly(t *testing.T) {
	const bs, size = 512, 4 << 20
	disk := bytes.Repeat([]byte{0xaa}, size)
	write := func(_ context.Context, p []byte, off int64) (int, error) {
		return copy(disk[off:], p), nil
	}
	off, length := int64(bs), int64(3<<20) // more than one chunk
	if err := WriteZeroesAsWrites(context.Background(), write, bs, size, off, length); err != nil {
		t.Fatal(err)
	}
	for i, b := range disk {
		want := byte(0xaa)
		if int64(i) >= off && int64(i) < off+length {
			want = 0
		}
		if b != want {
			t.Fatalf("byte %d = %#x, want %#x", i, b, want)
		}
	}
}

func TestCheckRangeRefusesUnalignedAndOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		off, length int64
		want        error
	}{
		{0, 512, nil},
		{1, 512, ErrUnaligned},
		{0, 100, ErrUnaligned},
		{-512, 512, ErrUnaligned},
		{4096 - 512, 1024, ErrOutOfRange},
	} {
		err := CheckRange(512, 4096, tc.off, tc.length)
		if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("CheckRange(%d, %d) = %v, want %v", tc.off, tc.length, err, tc.want)
		}
	}
}
