package instance

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"tern/instance/apiv1"
	"tern/vmm"
	"tern/vmm/guests"
	"tern/vmm/tap"
	"tern/volume/ec"
)

// ErrInvalidSpec is wrapped by every problem Validate finds.
var ErrInvalidSpec = errors.New("invalid instance spec")

// Host is what validation needs to know about the machine.
type Host struct {
	// MaxVCPUs is the most vCPUs the host's KVM gives one VM; 0 skips the
	// check (no /dev/kvm to ask).
	MaxVCPUs int
	// MemoryMiB is the host's RAM; 0 skips the check.
	MemoryMiB uint64
	// VolumeTLS reports whether the server has the certificates a volume
	// disk's upstairs presents.
	VolumeTLS bool
}

// MaxDisks is how many disks one instance may have: one virtio-blk
// device each, disks[i] in the VM's slot i (vmm.VirtioBlkAddr).
const MaxDisks = vmm.MaxDisks

// minMemoryMiB is the least guest RAM: the guests load at 1 MiB and the
// boot area sits below.
const minMemoryMiB = 2

// dirtyMemStartMiB is where the dirty guest's patterned area starts by
// default (vmm/guests: 4 MiB).
const dirtyMemStartMiB = 4

// guestParams lists the parameters each built-in guest takes through the
// API; a guest missing here takes none.
var guestParams = map[string][]string{
	"dirty": {"mem_mib", "working_set_mib", "dirty_mib_per_sec", "verify_every_sec", "idle"},
	"disk":  {"seed", "sectors", "device", "passes"},
	// hello_fault makes hello fault on purpose (vmm/guests.HelloFault*):
	// how a crash's report is seen through the API.
	"hello": {"hello_fault"},
}

// idPattern is compiled at its first use: its 128 repeats make a program
// of about 120 KB, which a process that never validates a spec (every
// command but vmm serve) should not build.
var idPattern = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

// IsBuiltinGuest reports whether path names a built-in guest rather than a
// file (the same rule as vmm.Config.Guest).
func IsBuiltinGuest(path string) bool {
	return !strings.Contains(path, "/") && !strings.HasSuffix(path, ".elf")
}

// Validate checks the spec against itself and the host and returns every
// problem at once, each wrapping ErrInvalidSpec, joined; nil when the
// spec can be built. It reads only file metadata (guest and disk files
// must exist); nothing is opened for long or created.
func Validate(s *apiv1.Spec, h Host) error {
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrInvalidSpec}, args...)...))
	}
	if !idPattern().MatchString(s.ID) {
		bad("id %q: want 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit", s.ID)
	}
	if s.Init.Method == apiv1.InitMigrationTarget {
		validateMigrationTarget(s, h, bad)
		validateComponents(s, bad)
		return errors.Join(errs...)
	}
	switch {
	case s.VCPUs < 1:
		bad("vcpus: %d; want at least 1", s.VCPUs)
	case h.MaxVCPUs > 0 && s.VCPUs > h.MaxVCPUs:
		bad("vcpus: %d is more than this host's KVM allows (%d)", s.VCPUs, h.MaxVCPUs)
	}
	switch {
	case s.MemoryMiB < minMemoryMiB:
		bad("memory_mib: %d; want at least %d", s.MemoryMiB, minMemoryMiB)
	case h.MemoryMiB > 0 && s.MemoryMiB > h.MemoryMiB:
		bad("memory_mib: %d is more than this host's RAM (%d MiB)", s.MemoryMiB, h.MemoryMiB)
	}
	validateGuest(s, bad)
	validateDisks(s, h, bad)
	validateNICs(s, bad)
	validateComponents(s, bad)
	if s.Init.Source != "" || s.Init.MigrationID != "" || s.Init.DowntimeTargetMs != nil || s.Init.SameHost {
		bad("init: source, migration_id, downtime_target_ms and same_host belong to method %q", apiv1.InitMigrationTarget)
	}
	switch s.Init.Method {
	case apiv1.InitSpecMethod:
	case "":
		bad(`init.method: missing; want "spec" or "migration_target"`)
	default:
		bad(`init.method %q: unknown; want "spec" or "migration_target"`, s.Init.Method)
	}
	return errors.Join(errs...)
}

// validateComponents checks every component with its kind's parser.
func validateComponents(s *apiv1.Spec, bad func(string, ...any)) {
	names := make([]string, 0, len(s.Components))
	for name := range s.Components {
		names = append(names, name)
	}
	sort.Strings(names)
	injectors := 0
	for _, name := range names {
		c := s.Components[name]
		parse, known := componentKinds[c.Kind]
		switch {
		case c.Kind == "":
			bad("components.%s: no kind", name)
		case !known:
			bad("components.%s: unknown kind %q", name, c.Kind)
		default:
			if err := parse(c.Raw); err != nil {
				bad("components.%s (%s): %v", name, c.Kind, err)
			}
		}
		if c.Kind == ComponentMigrationFailureInjector {
			injectors++
		}
	}
	if injectors > 1 {
		bad("components: %d of kind %s; want at most one", injectors, ComponentMigrationFailureInjector)
	}
}

// validateMigrationTarget checks a migration target's ensure: it names
// its source and migration and gives nothing the source's spec holds,
// but disk backends to replace (by name) and its own components.
func validateMigrationTarget(s *apiv1.Spec, h Host, bad func(string, ...any)) {
	in := s.Init
	if _, _, err := net.SplitHostPort(in.Source); err != nil {
		bad("init.source %q: want the source's migration_addr, host:port (%v)", in.Source, err)
	}
	if !idPattern().MatchString(in.MigrationID) {
		bad("init.migration_id %q: want 1-128 letters, digits, '.', '_' or '-', starting with a letter or digit", in.MigrationID)
	}
	if in.DowntimeTargetMs != nil && (*in.DowntimeTargetMs == 0 || *in.DowntimeTargetMs > maxDowntimeTargetMs) {
		bad("init.downtime_target_ms %d: want 1 to %d", *in.DowntimeTargetMs, maxDowntimeTargetMs)
	}
	// What the source's spec holds is inherited, never given.
	if s.Name != "" {
		bad("name: a migration target inherits the source's name; give none")
	}
	if s.VCPUs != 0 {
		bad("vcpus: a migration target inherits the source's vcpus; give none")
	}
	if s.MemoryMiB != 0 {
		bad("memory_mib: a migration target inherits the source's memory_mib; give none")
	}
	if !reflect.DeepEqual(s.Guest, apiv1.GuestSpec{}) {
		bad("guest: a migration target inherits the source's guest; give none")
	}
	if len(s.NICs) > 0 {
		bad("nics: a migration target inherits the source's nics; give none")
	}
	seen := map[string]int{}
	for i, d := range s.Disks {
		where := fmt.Sprintf("disks[%d]", i)
		if j, dup := seen[d.Name]; dup {
			bad("%s.name %q: duplicate of disks[%d]", where, d.Name, j)
		}
		seen[d.Name] = i
		b := d.Backend
		switch b.Kind {
		case apiv1.BackendFile:
			validateFileBackend(bad, where, b)
		case apiv1.BackendVolume:
			// gen 0 means the source's gen + 1, decided once the source's
			// spec is known.
			if b.Gen == 0 {
				b.Gen = 1
			}
			validateVolume(bad, where, b, h)
		case "":
			bad(`%s.backend.kind: missing; want "file" or "volume"`, where)
		default:
			bad(`%s.backend.kind %q: unknown; want "file" or "volume"`, where, b.Kind)
		}
	}
}

// maxDowntimeTargetMs bounds a migration's downtime target (one minute).
const maxDowntimeTargetMs = 60_000

func validateGuest(s *apiv1.Spec, bad func(string, ...any)) {
	g := s.Guest
	switch g.Kind {
	case apiv1.GuestELF:
		if g.Kernel != "" || g.Initrd != "" || g.Cmdline != "" {
			bad("guest: kernel, initrd and cmdline belong to kind %q", apiv1.GuestLinux)
		}
		switch {
		case g.Path == "":
			bad("guest.path: missing; want a file or one of the built-in guests %s", strings.Join(guests.Names(), ", "))
		case IsBuiltinGuest(g.Path):
			if !slices.Contains(guests.Names(), g.Path) {
				bad("guest.path %q: no such built-in guest (%s) and not a file path", g.Path, strings.Join(guests.Names(), ", "))
				return
			}
			validateParams(s, bad)
		default:
			checkFile(bad, "guest.path", g.Path)
			if len(g.Params) > 0 {
				bad("guest.params: only built-in guests take parameters")
			}
		}
	case apiv1.GuestLinux:
		if g.Path != "" || len(g.Params) > 0 {
			bad("guest: path and params belong to kind %q", apiv1.GuestELF)
		}
		if g.Kernel == "" {
			bad("guest.kernel: missing")
		} else {
			checkFile(bad, "guest.kernel", g.Kernel)
		}
		if g.Initrd != "" {
			checkFile(bad, "guest.initrd", g.Initrd)
		}
	case "":
		bad(`guest.kind: missing; want "elf" or "linux"`)
	default:
		bad(`guest.kind %q: unknown; want "elf" or "linux"`, g.Kind)
	}
}

func validateParams(s *apiv1.Spec, bad func(string, ...any)) {
	g := s.Guest
	allowed := guestParams[g.Path]
	keys := make([]string, 0, len(g.Params))
	for k := range g.Params {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if !slices.Contains(allowed, k) {
			if len(allowed) == 0 {
				bad("guest.params.%s: guest %s takes no parameters", k, g.Path)
			} else {
				bad("guest.params.%s: unknown parameter of guest %s (it takes %s)", k, g.Path, strings.Join(allowed, ", "))
			}
		}
	}
	switch g.Path {
	case "dirty":
		mem, ws := g.Params["mem_mib"], g.Params["working_set_mib"]
		if mem != 0 && dirtyMemStartMiB+mem > s.MemoryMiB {
			bad("guest.params.mem_mib: %d MiB from %d MiB does not fit in memory_mib %d", mem, dirtyMemStartMiB, s.MemoryMiB)
		}
		if mem == 0 && dirtyMemStartMiB+16 > s.MemoryMiB {
			bad("guest dirty: its default 16 MiB at %d MiB does not fit in memory_mib %d", dirtyMemStartMiB, s.MemoryMiB)
		}
		if ws != 0 && mem != 0 && ws > mem {
			bad("guest.params.working_set_mib: %d is more than mem_mib %d", ws, mem)
		}
		switch idle := g.Params["idle"]; {
		case idle > 1:
			bad("guest.params.idle: %d; want 1 (fill once, then dirty nothing) or 0", idle)
		case idle == 1 && g.Params["dirty_mib_per_sec"] != 0:
			bad("guest.params.dirty_mib_per_sec: %d, but an idle guest dirties nothing", g.Params["dirty_mib_per_sec"])
		}
	case "disk":
		if len(s.Disks) == 0 {
			bad("guest disk: needs a disk")
		} else if dev, ok := g.Params["device"]; ok && dev >= uint64(len(s.Disks)) {
			bad("guest.params.device: %d, but the spec has %d disks (device counts from 0)", dev, len(s.Disks))
		}
	}
}

func validateDisks(s *apiv1.Spec, h Host, bad func(string, ...any)) {
	if len(s.Disks) > MaxDisks {
		bad("disks: %d given; this VMM attaches at most %d", len(s.Disks), MaxDisks)
	}
	seen := map[string]int{}
	for i, d := range s.Disks {
		where := fmt.Sprintf("disks[%d]", i)
		if !idPattern().MatchString(d.Name) {
			bad("%s.name %q: want 1-128 letters, digits, '.', '_' or '-'", where, d.Name)
		} else if j, dup := seen[d.Name]; dup {
			bad("%s.name %q: duplicate of disks[%d]", where, d.Name, j)
		} else {
			seen[d.Name] = i
		}
		b := d.Backend
		switch b.Kind {
		case apiv1.BackendFile:
			validateFileBackend(bad, where, b)
		case apiv1.BackendVolume:
			validateVolume(bad, where, b, h)
		case "":
			bad(`%s.backend.kind: missing; want "file" or "volume"`, where)
		default:
			bad(`%s.backend.kind %q: unknown; want "file" or "volume"`, where, b.Kind)
		}
	}
}

// MaxNICs is how many network cards one instance may have.
const MaxNICs = vmm.MaxNICs

// validateNICs checks the network cards: how many, each TAP name and MAC,
// none twice (a card without a MAC counts with the one it will get).
func validateNICs(s *apiv1.Spec, bad func(string, ...any)) {
	if len(s.NICs) > MaxNICs {
		bad("nics: %d given; this VMM attaches at most %d", len(s.NICs), MaxNICs)
	}
	taps, macs := map[string]int{}, map[string]int{}
	for j, n := range s.NICs {
		where := fmt.Sprintf("nics[%d]", j)
		if err := tap.ValidName(n.TAP); err != nil {
			bad("%s.tap: %v", where, err)
		} else if k, dup := taps[n.TAP]; dup {
			bad("%s.tap %q: duplicate of nics[%d]", where, n.TAP, k)
		} else {
			taps[n.TAP] = j
		}
		mac, err := nicHardwareAddr(n)
		if err != nil {
			bad("%s.mac %q: %v", where, n.MAC, err)
			continue
		}
		if err := vmm.ValidateMAC(mac); err != nil {
			bad("%s.mac %q: %v", where, n.MAC, err)
		} else if k, dup := macs[mac.String()]; dup {
			bad("%s.mac %v: duplicate of nics[%d]", where, mac, k)
		} else {
			macs[mac.String()] = j
		}
	}
}

// nicHardwareAddr is the card's MAC: as given, or vmm.NICMAC of its TAP.
func nicHardwareAddr(n apiv1.NICSpec) (net.HardwareAddr, error) {
	if n.MAC == "" {
		return vmm.NICMAC(n.TAP), nil
	}
	mac, err := net.ParseMAC(n.MAC)
	if err != nil {
		return nil, errors.New("not a MAC address; want six hex bytes, as 52:54:00:12:34:56")
	}
	return mac, nil
}

// vmmNICs is the spec's cards as the VM takes them; the spec is valid.
func vmmNICs(s apiv1.Spec) []vmm.NIC {
	var out []vmm.NIC
	for _, n := range s.NICs {
		mac, _ := nicHardwareAddr(n)
		out = append(out, vmm.NIC{TAP: n.TAP, MAC: mac})
	}
	return out
}

func validateFileBackend(bad func(string, ...any), where string, b apiv1.BackendSpec) {
	if len(b.Targets) > 0 || b.Region != nil || b.Gen != 0 || b.QuorumWaitMs != nil || b.Layout != nil {
		bad("%s.backend: targets, layout, region, gen and quorum_wait_ms belong to kind %q", where, apiv1.BackendVolume)
	}
	if b.Path == "" {
		bad("%s.backend.path: missing", where)
	} else {
		checkFile(bad, where+".backend.path", b.Path)
	}
}

func validateVolume(bad func(string, ...any), where string, b apiv1.BackendSpec, h Host) {
	if b.Path != "" {
		bad("%s.backend.path: belongs to kind %q", where, apiv1.BackendFile)
	}
	if !h.VolumeTLS {
		bad("%s: volume disks need the server's --certs", where)
	}
	wantTargets := 3
	if l := b.Layout; l != nil {
		switch l.Kind {
		case apiv1.LayoutReplicated:
			if l.Data != 0 || l.Parity != 0 {
				bad("%s.backend.layout: data and parity belong to kind %q", where, apiv1.LayoutEC)
			}
		case apiv1.LayoutEC:
			if err := (ec.Layout{Data: l.Data, Parity: l.Parity}).Validate(); err != nil {
				bad("%s.backend.layout: data %d, parity %d: want data from %d to %d and parity from %d to %d",
					where, l.Data, l.Parity, ec.MinData, ec.MaxData, ec.MinParity, ec.MaxParity)
			} else {
				wantTargets = l.Data + l.Parity
			}
		default:
			bad(`%s.backend.layout.kind %q: want "replicated" or "ec"`, where, l.Kind)
		}
	}
	if len(b.Targets) != wantTargets {
		if b.ErasureCoded() {
			bad("%s.backend.targets: %d given; layout ec %d+%d wants %d host:port addresses, one per shard", where, len(b.Targets), b.Layout.Data, b.Layout.Parity, wantTargets)
		} else {
			bad("%s.backend.targets: %d given; want 3 host:port addresses", where, len(b.Targets))
		}
	}
	seen := map[string]int{}
	for i, t := range b.Targets {
		if _, _, err := net.SplitHostPort(t); err != nil {
			bad("%s.backend.targets[%d] %q: %v", where, i, t, err)
		}
		if j, dup := seen[t]; dup {
			bad("%s.backend.targets[%d] %q: duplicate of targets[%d]", where, i, t, j)
		}
		seen[t] = i
	}
	if b.Region == nil {
		bad("%s.backend.region: missing", where)
	} else {
		r := *b.Region
		if bs := r.BlockSize; bs < 512 || bs&(bs-1) != 0 {
			bad("%s.backend.region.block_size %d: want a power of two of at least 512", where, bs)
		}
		if r.ExtentBlocks == 0 || r.ExtentCount == 0 {
			bad("%s.backend.region: extent_blocks and extent_count must be at least 1", where)
		}
	}
	if b.Gen == 0 {
		bad("%s.backend.gen: want at least 1", where)
	}
}

func checkFile(bad func(string, ...any), what, path string) {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		bad("%s %q: %v", what, path, errors.Unwrap(err))
	case !fi.Mode().IsRegular():
		bad("%s %q: not a regular file", what, path)
	}
}
