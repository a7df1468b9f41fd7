package memory

import (
	"fmt"
	"sort"

	"golang.org/x/sys/unix"
)

// FromFds builds a Memory on existing memfds (received from another
// process, for a same-host migration): fds[i] backs specs[i]. It takes
// ownership of every fd, closing them all if it fails; on success Close
// closes them. Nothing is written to the memory: it holds what the
// sender's guest left there.
func FromFds(specs []RegionSpec, fds []int) (_ *Memory, err error) {
	owned := append([]int(nil), fds...)
	defer func() {
		for _, fd := range owned {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	if len(specs) != len(fds) {
		return nil, fmt.Errorf("building memory on memfds: %d specs, %d fds", len(specs), len(fds))
	}
	if err := validateSpecs(specs); err != nil {
		return nil, err
	}
	m := &Memory{}
	defer func() {
		if err != nil {
			m.Close()
		}
	}()
	for i, s := range specs {
		var st unix.Stat_t
		if err := unix.Fstat(fds[i], &st); err != nil {
			return nil, fmt.Errorf("checking memfd of %v: %w", s, err)
		}
		if uint64(st.Size) < s.Size {
			return nil, fmt.Errorf("checking memfd of %v: %d bytes, the region needs %d", s, st.Size, s.Size)
		}
		mem, err := unix.Mmap(fds[i], 0, int(s.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			return nil, fmt.Errorf("mapping %v: %w", s, err)
		}
		unix.CloseOnExec(fds[i])
		m.regions = append(m.regions, &Region{spec: s, fd: fds[i], mem: mem, dirty: NewDirtyBitmap(s.Size / PageSize)})
		owned[i] = -1
	}
	owned = nil
	sort.Slice(m.regions, func(i, j int) bool { return m.regions[i].spec.Base < m.regions[j].spec.Base })
	return m, nil
}
