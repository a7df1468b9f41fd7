package inspect

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"tern/internal/units"
	"tern/volume/wire"
)

// Region is a replica's geometry as JSON.
type Region struct {
	UUID         string `json:"uuid"`
	BlockSize    uint32 `json:"block_size"`
	ExtentBlocks uint32 `json:"extent_blocks"`
	ExtentCount  uint32 `json:"extent_count"`
}

// Replica is what one target told us.
type Replica struct {
	Target    string  `json:"target"`
	Reachable bool    `json:"reachable"`
	Region    *Region `json:"region"`
	// DirtyExtents counts extents with unflushed writes on this replica.
	DirtyExtents int    `json:"dirty_extents"`
	Error        string `json:"error,omitempty"`
	// Err is the error behind Error, for callers that branch on its type
	// (a TLS verification failure, a timeout); nil when reachable.
	Err      error `json:"-"`
	versions []wire.ExtentVersion
}

// Report is the result of Probe; its JSON form is the contract of
// `tern volume status --json`.
type Report struct {
	Replicas           []Replica `json:"replicas"`
	ExtentsTotal       int       `json:"extents_total"`
	ExtentsDisagreeing int       `json:"extents_disagreeing"`
	// GeometryMismatch names a difference between reachable replicas'
	// regions (uuid, block size, extent size or count); extents are not
	// compared when it is set.
	GeometryMismatch string `json:"geometry_mismatch,omitempty"`
}

// ErrNoReplica is returned when no target answered.
var ErrNoReplica = errors.New("no replica reachable")

// Probe asks every target, in parallel and read-only, for its region and
// extent versions. Each target gets at most timeout.
func Probe(ctx context.Context, targets []string, conf *tls.Config, timeout time.Duration) (*Report, error) {
	rep := &Report{Replicas: make([]Replica, len(targets))}
	var wg sync.WaitGroup
	for i, target := range targets {
		rep.Replicas[i].Target = target
		wg.Go(func() { probeOne(ctx, &rep.Replicas[i], conf, timeout) })
	}
	wg.Wait()
	var reached []*Replica
	for i := range rep.Replicas {
		if rep.Replicas[i].Reachable {
			reached = append(reached, &rep.Replicas[i])
		}
	}
	if len(reached) == 0 {
		return rep, ErrNoReplica
	}
	first := reached[0].Region
	rep.ExtentsTotal = int(first.ExtentCount)
	for _, r := range reached[1:] {
		if d := regionDiff(*first, *r.Region); d != "" {
			rep.GeometryMismatch = fmt.Sprintf("%s and %s: %s", reached[0].Target, r.Target, d)
			return rep, nil
		}
	}
	for e := range rep.ExtentsTotal {
		if extentDisagrees(reached, e) {
			rep.ExtentsDisagreeing++
		}
	}
	return rep, nil
}

// regionDiff names how b differs from a, or returns "".
func regionDiff(a, b Region) string {
	switch {
	case a.UUID != b.UUID:
		return fmt.Sprintf("region uuid %s differs from %s", b.UUID, a.UUID)
	case a.BlockSize != b.BlockSize:
		return fmt.Sprintf("block size %s differs from %s", units.FormatBytes(uint64(b.BlockSize)), units.FormatBytes(uint64(a.BlockSize)))
	case a.ExtentBlocks != b.ExtentBlocks:
		return fmt.Sprintf("extent size %d blocks differs from %d", b.ExtentBlocks, a.ExtentBlocks)
	case a.ExtentCount != b.ExtentCount:
		return fmt.Sprintf("extent count %d differs from %d", b.ExtentCount, a.ExtentCount)
	}
	return ""
}

// extentDisagrees applies the activation rule: an extent needs repair when
// any replica holds it dirty or the replicas' versions differ.
func extentDisagrees(reached []*Replica, e int) bool {
	v0 := reached[0].versions[e]
	for _, r := range reached {
		v := r.versions[e]
		if v.Dirty || v != v0 {
			return true
		}
	}
	return false
}

func probeOne(ctx context.Context, r *Replica, conf *tls.Config, timeout time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c := conf.Clone()
	if host, _, err := net.SplitHostPort(r.Target); err == nil && c.ServerName == "" {
		c.ServerName = host
	}
	s, err := dialReadOnly(ctx, r.Target, c)
	if err != nil {
		r.Error, r.Err = err.Error(), err
		return
	}
	defer s.close()
	versions, err := s.extentVersions()
	if err != nil {
		r.Error, r.Err = err.Error(), err
		return
	}
	r.Reachable = true
	r.Region = &Region{
		UUID: s.region.UUID.String(), BlockSize: s.region.BlockSize,
		ExtentBlocks: s.region.ExtentBlocks, ExtentCount: s.region.ExtentCount,
	}
	r.versions = versions
	for _, v := range versions {
		if v.Dirty {
			r.DirtyExtents++
		}
	}
}
