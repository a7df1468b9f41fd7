package extent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/google/uuid"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"tern/volume/ids"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"
)

// Names of the files in a region directory besides the extent files.
const (
	regionFileName = "region.json"
	fenceFileName  = "fence.json"
)

// metaChunkBlocks is how many metadata entries one scratch buffer holds;
// larger IOs are handled in chunks of this many blocks.
const metaChunkBlocks = 2048

// metaScratch is a reusable buffer for metadata entries, so the IO path
// allocates nothing per call.
type metaScratch [metaChunkBlocks * metaEntrySize]byte

// crashStep names a point in a write, flush or repair where a test may
// simulate a power cut (see faultHook).
type crashStep int

const (
	stepBeforeDirtyTrailer crashStep = iota + 1 // clean extent, nothing written yet
	stepBeforeData                              // dirty trailer durable, no data yet
	stepAfterData                               // data written, metadata not
	stepAfterMeta                               // data and metadata written
	stepFlushSynced                             // extent fdatasync'd, trailer still dirty
	stepRepairWritten                           // repair blocks written, trailer not yet set
)

// Region is one downstairs replica's on-disk region: the directory, its
// region.json and one file per extent. It owns the open files and the
// directory lock; Close releases them. A Region is safe for concurrent use
// (see doc.go for what callers must order themselves).
type Region struct {
	// Immutable after Create/Open.
	dir      string
	spec     Spec
	lay      layout
	zeroHash uint64 // xxhash64 of a zero block: the hash of a never-written block
	readOnly bool
	fsys     FS       // where the files are
	lock     *os.File // the region directory, flock'd while the Region is open; nil on another FS
	extents  []*extent
	scratch  sync.Pool // *metaScratch
	// faultHook, when set by a test, is called at each crashStep; an error
	// stops the operation there, as a power cut would.
	faultHook func(crashStep) error

	flushMu   sync.Mutex // serializes Flush
	flushList []*extent  // guarded by flushMu: scratch for the extents one Flush cleans

	// lostWrites: opened with an extent dirty, and not flushed since
	// (MayHaveLostWrites).
	lostWrites atomic.Bool

	genMu      sync.Mutex
	highestGen ids.Generation // guarded by genMu
	genHolder  uuid.UUID      // guarded by genMu: the upstairs at highestGen

	mu     sync.RWMutex // held shared by every operation, exclusively by Close
	closed bool         // guarded by mu
}

// Create makes a new region in dir (creating dir and its parents if
// needed) and returns it open. It fails with ErrRegionExists when dir
// already holds a region.json, and with ErrInvalidSpec when spec does not
// validate. Extent files are created sparse: creating a large region
// writes only the trailers.
func Create(dir string, spec Spec) (*Region, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("create region: %w", err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create region: %w", classify(err))
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("create region: %w", err)
	}
	fsys := osFS{dir: dir, lock: lock}
	if err := createFiles(fsys, spec); err != nil {
		lock.Close()
		return nil, fmt.Errorf("create region %s: %w", dir, err)
	}
	r, err := load(fsys, dir, lock)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("create region %s: %w", dir, err)
	}
	return r, nil
}

// CreateOn makes a new region on fsys, as Create does in a directory, and
// returns it open; Dir reports name. fsys must not be shared with another
// open Region (CreateOn takes no lock).
func CreateOn(fsys FS, name string, spec Spec) (*Region, error) {
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("create region: %w", err)
	}
	if err := createFiles(fsys, spec); err != nil {
		return nil, fmt.Errorf("create region %s: %w", name, err)
	}
	r, err := load(fsys, name, nil)
	if err != nil {
		return nil, fmt.Errorf("create region %s: %w", name, err)
	}
	return r, nil
}

// OpenOn opens the region on fsys, as Open does a directory: dirty
// extents are verified block by block. fsys must not be shared with
// another open Region (OpenOn takes no lock).
func OpenOn(fsys FS, name string) (*Region, error) {
	r, err := load(fsys, name, nil)
	if err != nil {
		return nil, fmt.Errorf("open region %s: %w", name, err)
	}
	return r, nil
}

// Open opens the region in dir. It fails with ErrNoRegion when dir or its
// region.json does not exist, with ErrInUse when the region is already
// open, and with ErrBadRegion when the files are damaged beyond what a
// crash can do. Extents whose trailer is dirty (or unreadable) are verified
// block by block; blocks whose data does not match their recorded hash are
// reported by CorruptBlocks and never served. On a read-only file system
// the region opens read-only (ReadOnly reports it; writes fail with
// ErrReadOnly).
func Open(dir string) (*Region, error) {
	lock, err := lockDir(dir)
	if err != nil {
		return nil, fmt.Errorf("open region: %w", err)
	}
	r, err := load(osFS{dir: dir, lock: lock}, dir, lock)
	if err != nil {
		lock.Close()
		return nil, fmt.Errorf("open region %s: %w", dir, err)
	}
	return r, nil
}

// lockDir opens dir and takes an exclusive, non-blocking flock on it.
func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%w: %w", ErrNoRegion, err)
	}
	if err != nil {
		return nil, fmt.Errorf("open region directory: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EWOULDBLOCK {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, ErrInUse)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, os.NewSyscallError("flock", err))
	}
	return f, nil
}

// createFiles writes a fresh region's extent files and then its
// region.json. region.json is written last and atomically, so a crash
// part way leaves no region (and a later Create simply overwrites the
// leftovers).
func createFiles(fsys FS, spec Spec) (err error) {
	switch _, statErr := fsys.ReadFile(regionFileName); {
	case statErr == nil:
		return ErrRegionExists
	case !isNotExist(statErr):
		return fmt.Errorf("check for region: %w", statErr)
	}
	lay := newLayout(spec)
	created := 0
	defer func() {
		if err != nil {
			for id := range created {
				fsys.Remove(extentFileName(ids.ExtentID(id)))
			}
		}
	}()
	for id := range spec.ExtentCount {
		created++ // counted first, so a half-made file is removed too
		if err := createExtentFile(fsys, lay, ids.ExtentID(id)); err != nil {
			return err
		}
	}
	if err := fsys.Remove(fenceFileName); err != nil && !isNotExist(err) {
		return fmt.Errorf("remove old fence: %w", classify(err))
	}
	// One syncfs makes every extent file durable; cheaper than an fsync
	// per file for regions of thousands of extents.
	if err := fsys.SyncAll(); err != nil {
		return fmt.Errorf("sync extent files: %w", classify(err))
	}
	js, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return fmt.Errorf("encode region spec: %w", err)
	}
	return fsys.WriteFileAtomic(regionFileName, append(js, '\n'))
}

// createExtentFile creates one sparse extent file with a clean trailer
// {gen 0, flush 0}.
func createExtentFile(fsys FS, lay layout, id ids.ExtentID) error {
	f, err := fsys.CreateFile(extentFileName(id), lay.fileSize)
	if err != nil {
		return fmt.Errorf("create extent %d: %w", id, classify(err))
	}
	defer f.Close()
	var buf [trailerSize]byte
	trailer{id: id}.encode(&buf)
	if err := pwriteFull(f, buf[:], lay.trailerOff); err != nil {
		return fmt.Errorf("write extent %d trailer: %w", id, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close extent %d: %w", id, classify(err))
	}
	return nil
}

// writeFileAtomic replaces dir/name with data: temporary file, fsync,
// rename, fsync of the directory (dirFile).
func writeFileAtomic(dirFile *os.File, dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o640)
	if err != nil {
		return fmt.Errorf("create %s: %w", name, classify(err))
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", name, classify(err))
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("sync %s: %w", name, classify(err))
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("close %s: %w", name, classify(err))
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rename %s: %w", name, classify(err))
	}
	if err := dirFile.Sync(); err != nil {
		return fmt.Errorf("sync region directory: %w", classify(err))
	}
	return nil
}

// readSpec reads and validates region.json.
func readSpec(fsys FS) (Spec, error) {
	js, err := fsys.ReadFile(regionFileName)
	if isNotExist(err) {
		return Spec{}, fmt.Errorf("%w: %w", ErrNoRegion, err)
	}
	if err != nil {
		return Spec{}, fmt.Errorf("read region spec: %w", err)
	}
	var spec Spec
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return Spec{}, fmt.Errorf("%w: decode %s: %w", ErrBadRegion, regionFileName, err)
	}
	if err := spec.Validate(); err != nil {
		return Spec{}, fmt.Errorf("%w: %s: %w", ErrBadRegion, regionFileName, err)
	}
	return spec, nil
}

// load opens the region on fsys, named dir; lock is its directory lock,
// already held (nil on another FS).
func load(fsys FS, dir string, lock *os.File) (*Region, error) {
	spec, err := readSpec(fsys)
	if err != nil {
		return nil, err
	}
	r := &Region{
		dir:      dir,
		fsys:     fsys,
		spec:     spec,
		lay:      newLayout(spec),
		zeroHash: xxhash.Sum64(make([]byte, spec.BlockSize)),
		lock:     lock,
		extents:  make([]*extent, spec.ExtentCount),
	}
	r.scratch.New = func() any { return new(metaScratch) }
	r.flushList = make([]*extent, 0, spec.ExtentCount)

	// A read-only mount (or read-only files) opens read-only rather than
	// failing: reads are still served.
	if f, err := fsys.OpenFile(extentFileName(0), false); err == nil {
		f.Close()
	} else if errors.Is(classify(err), ErrReadOnly) {
		r.readOnly = true
	}
	if err := r.loadExtents(); err != nil {
		r.closeExtents()
		return nil, err
	}
	for _, e := range r.extents {
		if e.version().Dirty {
			r.lostWrites.Store(true)
		}
	}
	f, err := readFence(fsys)
	if err != nil {
		r.closeExtents()
		return nil, err
	}
	r.highestGen, r.genHolder = f.HighestGen, f.Holder
	return r, nil
}

// loadExtents opens and, where dirty, verifies every extent, on up to
// GOMAXPROCS goroutines (verification reads whole extents).
func (r *Region) loadExtents() error {
	workers := min(runtime.GOMAXPROCS(0), int(r.spec.ExtentCount), 8)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		next  int
		first error
	)
	for range workers {
		wg.Go(func() {
			var v verifier
			for {
				mu.Lock()
				id := next
				next++
				stop := first != nil || id >= len(r.extents)
				mu.Unlock()
				if stop {
					return
				}
				e, err := r.loadExtent(ids.ExtentID(id), &v)
				mu.Lock()
				if err != nil && first == nil {
					first = err
				}
				r.extents[id] = e
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// closeExtents closes every open extent file.
func (r *Region) closeExtents() error {
	var errs []error
	for _, e := range r.extents {
		if e != nil {
			if err := e.file.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close extent %d: %w", e.id, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Close closes the region's files and releases its directory lock. It does
// not flush: writes since the last Flush are not promised to survive, and
// their extents stay dirty and are verified at the next Open. Calls after
// Close fail with ErrClosed.
func (r *Region) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("close region: %w", ErrClosed)
	}
	r.closed = true
	err := r.closeExtents()
	// Closing the directory releases the flock.
	if r.lock == nil {
		// Another FS: nothing to unlock.
	} else if lockErr := r.lock.Close(); lockErr != nil {
		err = errors.Join(err, fmt.Errorf("close region directory: %w", lockErr))
	}
	if err != nil {
		return fmt.Errorf("close region: %w", err)
	}
	return nil
}

// begin starts an operation: it holds r.mu shared until end, so Close
// waits for operations in flight.
func (r *Region) begin() error {
	r.mu.RLock()
	if r.closed {
		r.mu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (r *Region) end() { r.mu.RUnlock() }

// fault calls the test hook, if any.
func (r *Region) fault(step crashStep) error {
	if r.faultHook == nil {
		return nil
	}
	return r.faultHook(step)
}

// Spec returns the region's spec.
func (r *Region) Spec() Spec { return r.spec }

// Dir returns the region's directory.
func (r *Region) Dir() string { return r.dir }

// ReadOnly reports whether the region was opened read-only because its
// files or file system cannot be written.
func (r *Region) ReadOnly() bool { return r.readOnly }

// MayHaveLostWrites reports whether the region was opened with an extent
// written since its last flush (a crash or an unclean stop) and has not
// been flushed since: writes acknowledged before the crash but never
// flushed may be gone, so its content is not what its last writer saw.
// A downstairs tells a rejoining upstairs (wire.ActivateAck.LostWrites),
// which then repairs the replica instead of replaying its backlog.
func (r *Region) MayHaveLostWrites() bool { return r.lostWrites.Load() }

// Versions returns every extent's trailer, indexed by ExtentID.
func (r *Region) Versions() []Version {
	out := make([]Version, len(r.extents))
	for i, e := range r.extents {
		out[i] = e.version()
	}
	return out
}

// ExtentVersion returns extent e's trailer; ErrOutOfRange if there is no
// such extent.
func (r *Region) ExtentVersion(e ids.ExtentID) (Version, error) {
	if uint64(e) >= uint64(len(r.extents)) {
		return Version{}, fmt.Errorf("get extent %d version: %w", e, ErrOutOfRange)
	}
	return r.extents[e].version(), nil
}

// CorruptBlocks returns the blocks currently marked corrupt, in ascending
// order: blocks found inconsistent with their recorded hash at Open, and
// blocks whose write failed part way. They stay corrupt until written or
// repaired.
func (r *Region) CorruptBlocks() []ids.BlockIndex {
	var out []ids.BlockIndex
	for _, e := range r.extents {
		for _, b := range e.corruptList() {
			out = append(out, r.blockIndex(e.id, b))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// blockIndex converts an extent-relative block to a region-wide one.
func (r *Region) blockIndex(e ids.ExtentID, b uint32) ids.BlockIndex {
	return ids.BlockIndex(uint64(e)*uint64(r.spec.ExtentBlocks) + uint64(b))
}

func (r *Region) getScratch() *metaScratch  { return r.scratch.Get().(*metaScratch) }
func (r *Region) putScratch(s *metaScratch) { r.scratch.Put(s) }
