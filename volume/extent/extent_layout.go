package extent

import (
	"encoding/binary"
	"fmt"
	"tern/volume/ids"

	"github.com/cespare/xxhash/v2"
)

// Extent file layout (see doc.go for the picture and the crash rules).
const (
	// metaEntrySize is one block's metadata: xxhash64 of the block as
	// written (u64 LE), then the extent's write counter at that write
	// (u64 LE). All zero means "never written".
	metaEntrySize = 16
	// trailerSize is the encoded trailer.
	trailerSize = 64
	// trailerAlign keeps the trailer inside one page and one sector, so a
	// trailer write is never split across two.
	trailerAlign = 4096
	// trailerMagic is "TERNEXT1" read as a little-endian u64.
	trailerMagic uint64 = 0x315458454e524554
	// trailerChecksummed is how many leading trailer bytes the checksum at
	// that offset covers.
	trailerChecksummed = 48
)

// layout is where things are inside one extent file.
type layout struct {
	blockSize  int64
	blocks     uint32
	metaOff    int64 // first metadata entry, right after the block data
	trailerOff int64 // trailer, aligned to trailerAlign
	fileSize   int64
}

func newLayout(s Spec) layout {
	dataLen := int64(s.ExtentBlocks) * int64(s.BlockSize)
	metaEnd := dataLen + int64(s.ExtentBlocks)*metaEntrySize
	trailerOff := (metaEnd + trailerAlign - 1) / trailerAlign * trailerAlign
	return layout{
		blockSize:  int64(s.BlockSize),
		blocks:     s.ExtentBlocks,
		metaOff:    dataLen,
		trailerOff: trailerOff,
		fileSize:   trailerOff + trailerSize,
	}
}

func (l layout) dataOff(block uint32) int64 { return int64(block) * l.blockSize }
func (l layout) metaEntryOff(block uint32) int64 {
	return l.metaOff + int64(block)*metaEntrySize
}

// extentFileName is the name of extent id's file inside the region dir.
func extentFileName(id ids.ExtentID) string { return fmt.Sprintf("%06d.ext", id) }

// trailer is the decoded end of an extent file.
type trailer struct {
	id  ids.ExtentID
	ver Version
	// seq is the extent's write counter when the trailer was written; the
	// counter continues from here (or from the largest counter in the
	// metadata, for an extent that was dirty at open).
	seq uint64
}

// encode writes t into buf. Layout (little endian): magic u64, format u32,
// extent id u32, gen u64, flush u64, seq u64, dirty u8, 7 zero bytes,
// xxhash64 of the 48 bytes before it, 8 zero bytes.
func (t trailer) encode(buf *[trailerSize]byte) {
	*buf = [trailerSize]byte{}
	binary.LittleEndian.PutUint64(buf[0:], trailerMagic)
	binary.LittleEndian.PutUint32(buf[8:], FormatVersion1)
	binary.LittleEndian.PutUint32(buf[12:], uint32(t.id))
	binary.LittleEndian.PutUint64(buf[16:], uint64(t.ver.Gen))
	binary.LittleEndian.PutUint64(buf[24:], t.ver.Flush)
	binary.LittleEndian.PutUint64(buf[32:], t.seq)
	if t.ver.Dirty {
		buf[40] = 1
	}
	binary.LittleEndian.PutUint64(buf[48:], xxhash.Sum64(buf[:trailerChecksummed]))
}

// decodeTrailer parses buf as extent id's trailer. ok is false for a torn,
// garbled or foreign trailer; the caller then treats the extent as dirty.
func decodeTrailer(buf []byte, id ids.ExtentID) (t trailer, ok bool) {
	if len(buf) < trailerSize {
		return trailer{}, false
	}
	if binary.LittleEndian.Uint64(buf[0:]) != trailerMagic ||
		binary.LittleEndian.Uint32(buf[8:]) != FormatVersion1 ||
		binary.LittleEndian.Uint32(buf[12:]) != uint32(id) ||
		binary.LittleEndian.Uint64(buf[48:]) != xxhash.Sum64(buf[:trailerChecksummed]) ||
		buf[40] > 1 {
		return trailer{}, false
	}
	for _, b := range buf[41:48] {
		if b != 0 {
			return trailer{}, false
		}
	}
	return trailer{
		id: id,
		ver: Version{
			Gen:   ids.Generation(binary.LittleEndian.Uint64(buf[16:])),
			Flush: binary.LittleEndian.Uint64(buf[24:]),
			Dirty: buf[40] == 1,
		},
		seq: binary.LittleEndian.Uint64(buf[32:]),
	}, true
}

// putMeta encodes one block's metadata entry.
func putMeta(dst []byte, hash, seq uint64) {
	binary.LittleEndian.PutUint64(dst[0:], hash)
	binary.LittleEndian.PutUint64(dst[8:], seq)
}

// getMeta decodes one block's metadata entry; an all-zero entry is a
// never-written block, whose recorded hash is that of a zero block.
func getMeta(src []byte, zeroHash uint64) (hash, seq uint64) {
	hash = binary.LittleEndian.Uint64(src[0:])
	seq = binary.LittleEndian.Uint64(src[8:])
	if hash == 0 && seq == 0 {
		return zeroHash, 0
	}
	return hash, seq
}
