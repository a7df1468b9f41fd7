package wire

import "slices"

// Clone returns a copy of m that shares no memory with it. A message the
// Decoder returns lives in buffers the next call to Next reuses; Clone is
// how a receiver keeps one.
func Clone(m Message) Message {
	switch m := m.(type) {
	case *Hello:
		c := *m
		c.Versions = slices.Clone(m.Versions)
		return &c
	case *HelloReply:
		c := *m
		return &c
	case *Error:
		c := *m
		return &c
	case *Activate:
		c := *m
		return &c
	case *ActivateAck:
		c := *m
		return &c
	case *Fenced:
		c := *m
		return &c
	case *RegionInfoRequest:
		c := *m
		return &c
	case *RegionInfoReply:
		c := *m
		return &c
	case *ExtentVersionsRequest:
		c := *m
		return &c
	case *ExtentVersions:
		c := *m
		c.Versions = slices.Clone(m.Versions)
		return &c
	case *Write:
		c := *m
		c.Deps, c.Hashes, c.Data = slices.Clone(m.Deps), slices.Clone(m.Hashes), slices.Clone(m.Data)
		return &c
	case *Read:
		c := *m
		c.Deps = slices.Clone(m.Deps)
		return &c
	case *ReadResponse:
		c := *m
		c.Hashes, c.Data = slices.Clone(m.Hashes), slices.Clone(m.Data)
		return &c
	case *Flush:
		c := *m
		c.Deps = slices.Clone(m.Deps)
		return &c
	case *Ack:
		c := *m
		return &c
	case *ExtentHashesRequest:
		c := *m
		return &c
	case *ExtentHashes:
		c := *m
		c.Hashes = slices.Clone(m.Hashes)
		return &c
	case *RepairRead:
		c := *m
		c.Blocks = slices.Clone(m.Blocks)
		return &c
	case *RepairData:
		c := *m
		c.Blocks, c.Hashes, c.Data = slices.Clone(m.Blocks), slices.Clone(m.Hashes), slices.Clone(m.Data)
		return &c
	case *RepairWrite:
		c := *m
		c.Blocks, c.Hashes, c.Data = slices.Clone(m.Blocks), slices.Clone(m.Hashes), slices.Clone(m.Data)
		return &c
	}
	return m
}
