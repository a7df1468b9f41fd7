// Package volume is the vocabulary every volume layout speaks: the Volume
// interface (block IO, geometry, activation by generation, a
// layout-neutral status, Close), the errors a caller branches on whichever
// the layout, and the timing defaults the layouts share.
//
// The layouts implement it: volume/upstairs (three replicas) and
// volume/ec (K+M erasure-coded shards); volume/layout is the one place
// that picks between them. Everything above the volume (the VMM's disks
// through an adapter in instance, the NBD export, the CLI, the
// benchmarks) holds a Volume, not a layout's type, unless it uses what
// only one layout has (a replica's repair, an EC scrub's report).
//
// The package is plain data: no sockets, files or clocks, so the decision
// cores (volume/upstairs/engine) may share its errors.
package volume
