package nbd

// Wire constants of the NBD protocol (the NBD project's doc/proto.md),
// fixed-newstyle negotiation only. Every integer on the wire is big-endian.

// Magics.
const (
	magicInit        uint64 = 0x4e42444d41474943 // "NBDMAGIC", the server's greeting
	magicOption      uint64 = 0x49484156454f5054 // "IHAVEOPT", the newstyle greeting and each option
	magicOptionReply uint64 = 0x0003e889045565a9
	magicRequest     uint32 = 0x25609513
	magicSimple      uint32 = 0x67446698
	magicStructured  uint32 = 0x668e33ef
)

// Handshake flags the server sends, and client flags it accepts.
const (
	flagFixedNewstyle uint16 = 1 << 0
	flagNoZeroes      uint16 = 1 << 1

	clientFixedNewstyle uint32 = 1 << 0
	clientNoZeroes      uint32 = 1 << 1
	clientKnownFlags           = clientFixedNewstyle | clientNoZeroes
)

// Options.
const (
	optExportName      uint32 = 1
	optAbort           uint32 = 2
	optList            uint32 = 3
	optStartTLS        uint32 = 5
	optInfo            uint32 = 6
	optGo              uint32 = 7
	optStructuredReply uint32 = 8
)

// Option reply types; errors have bit 31 set.
const (
	repAck    uint32 = 1
	repServer uint32 = 2
	repInfo   uint32 = 3

	repErrUnsup   uint32 = 1<<31 + 1
	repErrInvalid uint32 = 1<<31 + 3
	repErrTLSReqd uint32 = 1<<31 + 5
	repErrUnknown uint32 = 1<<31 + 6
)

// Information types of NBD_OPT_INFO and NBD_OPT_GO.
const (
	infoExport      uint16 = 0
	infoName        uint16 = 1
	infoDescription uint16 = 2
	infoBlockSize   uint16 = 3
)

// Transmission flags, sent with the export's size.
const (
	FlagHasFlags        uint16 = 1 << 0
	FlagReadOnly        uint16 = 1 << 1
	FlagSendFlush       uint16 = 1 << 2
	FlagSendFUA         uint16 = 1 << 3
	FlagSendTrim        uint16 = 1 << 5
	FlagSendWriteZeroes uint16 = 1 << 6
	FlagCanMultiConn    uint16 = 1 << 8
)

// Commands.
const (
	cmdRead        uint16 = 0
	cmdWrite       uint16 = 1
	cmdDisc        uint16 = 2
	cmdFlush       uint16 = 3
	cmdTrim        uint16 = 4
	cmdWriteZeroes uint16 = 6
)

// Command flags.
const (
	cmdFlagFUA    uint16 = 1 << 0
	cmdFlagNoHole uint16 = 1 << 1
)

// Structured reply chunk types and flags.
const (
	replyFlagDone uint16 = 1 << 0

	replyNone       uint16 = 0
	replyOffsetData uint16 = 1
	replyError      uint16 = 1<<15 + 1
)

// Errno is an error value of the NBD protocol (not the host's errno).
type Errno uint32

// The errors this server sends.
const (
	EPERM     Errno = 1
	EIO       Errno = 5
	EINVAL    Errno = 22
	ENOSPC    Errno = 28
	ESHUTDOWN Errno = 108
)

// Sizes on the wire.
const (
	requestHeaderBytes = 28 // magic, flags, type, cookie, offset, length
	optionHeaderBytes  = 16 // magic, option, length
)

// Limits this server holds clients to.
const (
	// MaxRequestBytes is the largest READ or WRITE payload (advertised
	// as the maximum block size): 32 MiB, what qemu's NBD client
	// assumes when a server names none.
	MaxRequestBytes = 32 << 20
	// maxOptionBytes bounds an option's data. The longest legitimate
	// option is NBD_OPT_GO with a 4 KiB name and a few info requests.
	maxOptionBytes = 64 << 10
	// maxNameBytes is the longest export name the protocol allows.
	maxNameBytes = 4096
	// maxOptions bounds how many options one handshake may send, so a
	// client cannot hold a connection in negotiation forever.
	maxOptions = 1024
)
