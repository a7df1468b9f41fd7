package ec

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/cespare/xxhash/v2"
	"github.com/google/uuid"

	"tern/volume/ids"
)

// The last block of every shard's region is not client data: it holds the
// shard's metadata, rewritten (before the flush, on the same stream)
// with every flush that finds the shard current. A shard whose metadata
// names an older flush than its peers' missed writes since then.
//
//	[0, 8)    magic "TERNEC01"
//	[8, 12)   format u32 (1)
//	[12]      data shards u8
//	[13]      parity shards u8
//	[14]      shard index u8
//	[15]      zero
//	[16, 32)  region uuid
//	[32, 40)  gen u64: the generation of the flush below
//	[40, 48)  flush u64: the last flush the shard took while current
//	[48, 56)  xxhash64 of [0, 48)
//
// The rest of the block is zero. A block of zeros is a shard that never
// took a flush (a new or replaced region).
const (
	metaMagic   = "TERNEC01"
	metaFormat  = 1
	metaSize    = 56
	metaMinSize = 512
)

// ErrBadShardMeta: a shard's metadata block is neither all zero nor a
// valid record.
var ErrBadShardMeta = errors.New("bad shard metadata")

// shardMeta is one shard's metadata block.
type shardMeta struct {
	Layout Layout
	Shard  int
	Region uuid.UUID
	Gen    ids.Generation
	Flush  uint64
}

// encode writes m into block (at least metaMinSize bytes), zeroing the rest.
func (m shardMeta) encode(block []byte) {
	clear(block)
	copy(block, metaMagic)
	binary.LittleEndian.PutUint32(block[8:], metaFormat)
	block[12], block[13], block[14] = byte(m.Layout.Data), byte(m.Layout.Parity), byte(m.Shard)
	copy(block[16:32], m.Region[:])
	binary.LittleEndian.PutUint64(block[32:], uint64(m.Gen))
	binary.LittleEndian.PutUint64(block[40:], m.Flush)
	binary.LittleEndian.PutUint64(block[48:], xxhash.Sum64(block[:48]))
}

// decodeShardMeta reads a metadata block: ok false for a block of zeros
// (never written), an error wrapping ErrBadShardMeta for anything else
// that is not a valid record.
func decodeShardMeta(block []byte) (m shardMeta, ok bool, err error) {
	if len(block) < metaMinSize {
		return m, false, fmt.Errorf("%w: block of %d bytes", ErrBadShardMeta, len(block))
	}
	if allZero(block) {
		return m, false, nil
	}
	if string(block[:8]) != metaMagic {
		return m, false, fmt.Errorf("%w: no magic", ErrBadShardMeta)
	}
	if f := binary.LittleEndian.Uint32(block[8:]); f != metaFormat {
		return m, false, fmt.Errorf("%w: format %d", ErrBadShardMeta, f)
	}
	if binary.LittleEndian.Uint64(block[48:]) != xxhash.Sum64(block[:48]) || block[15] != 0 || !allZero(block[metaSize:]) {
		return m, false, fmt.Errorf("%w: checksum or padding", ErrBadShardMeta)
	}
	m.Layout = Layout{Data: int(block[12]), Parity: int(block[13])}
	if err := m.Layout.Validate(); err != nil {
		return m, false, fmt.Errorf("%w: %w", ErrBadShardMeta, err)
	}
	m.Shard = int(block[14])
	if m.Shard >= m.Layout.Shards() {
		return m, false, fmt.Errorf("%w: shard %d of layout %v", ErrBadShardMeta, m.Shard, m.Layout)
	}
	copy(m.Region[:], block[16:32])
	m.Gen = ids.Generation(binary.LittleEndian.Uint64(block[32:]))
	m.Flush = binary.LittleEndian.Uint64(block[40:])
	return m, true, nil
}

func allZero(b []byte) bool {
	return len(b) == 0 || b[0] == 0 && bytes.Equal(b[1:], make([]byte, len(b)-1))
}
