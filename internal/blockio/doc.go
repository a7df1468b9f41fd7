// Package blockio is the IO every block device in tern offers, written
// once: a volume of any layout (tern/volume.Volume embeds it), a local
// file (vmm/devices.FileBackend), and what the VMM's virtio-blk device
// and the NBD export serve from. It sits in internal/ because both the
// VMM and the volume use it and neither may know the other.
package blockio
