package sim

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync/atomic"

	"tern/volume/downstairs"
	"tern/volume/extent"
	"tern/volume/transport"
)

// ecShard is one shard's downstairs in the erasure-coded world: the
// production server (volume/downstairs) on the production extent store,
// on a simulated disk, listening with the production transport on the
// simulated network. Crashing it stops its process where it stands: the
// disk keeps what was synced and a random prefix of the rest, and
// nothing the dying server still does reaches the disk or the network.
type ecShard struct {
	id   int
	addr string // host:port on the simulated network
	host string
	net  *packetNet
	tls  *tls.Config
	spec extent.Spec

	disk *disk
	life *liveFS // this incarnation's view of disk; nil while down
	ln   *transport.Listener
	stop context.CancelFunc
	done chan struct{}
}

// errDead is what a crashed incarnation's late disk IO gets.
var errDead = errors.New("simulated downstairs crashed")

// liveFS is one incarnation's view of a disk: once killed, every call
// fails, so a crashed server's jobs still running change nothing.
type liveFS struct {
	d    *disk
	dead atomic.Bool
}

func (l *liveFS) OpenFile(name string, readOnly bool) (extent.File, error) {
	if l.dead.Load() {
		return nil, errDead
	}
	f, err := l.d.OpenFile(name, readOnly)
	if err != nil {
		return nil, err
	}
	return liveFile{f, l}, nil
}

func (l *liveFS) CreateFile(name string, size int64) (extent.File, error) {
	if l.dead.Load() {
		return nil, errDead
	}
	f, err := l.d.CreateFile(name, size)
	if err != nil {
		return nil, err
	}
	return liveFile{f, l}, nil
}

func (l *liveFS) ReadFile(name string) ([]byte, error) {
	if l.dead.Load() {
		return nil, errDead
	}
	return l.d.ReadFile(name)
}

func (l *liveFS) WriteFileAtomic(name string, data []byte) error {
	if l.dead.Load() {
		return errDead
	}
	return l.d.WriteFileAtomic(name, data)
}

func (l *liveFS) Remove(name string) error {
	if l.dead.Load() {
		return errDead
	}
	return l.d.Remove(name)
}

func (l *liveFS) SyncAll() error {
	if l.dead.Load() {
		return errDead
	}
	return l.d.SyncAll()
}

type liveFile struct {
	extent.File
	l *liveFS
}

func (f liveFile) ReadAt(p []byte, off int64) (int, error) {
	if f.l.dead.Load() {
		return 0, errDead
	}
	return f.File.ReadAt(p, off)
}

func (f liveFile) WriteAt(p []byte, off int64) (int, error) {
	if f.l.dead.Load() {
		return 0, errDead
	}
	return f.File.WriteAt(p, off)
}

func (f liveFile) Datasync() error {
	if f.l.dead.Load() {
		return errDead
	}
	return f.File.Datasync()
}

// create makes the shard's empty region on a new disk (a new shard, or
// a failed one replaced by an operator).
func (s *ecShard) create() error {
	s.disk = newDisk()
	r, err := extent.CreateOn(s.disk, fmt.Sprintf("shard%d", s.id), s.spec)
	if err != nil {
		return fmt.Errorf("create shard %d: %w", s.id, err)
	}
	return r.Close()
}

// start opens the region and serves it until crash or halt.
func (s *ecShard) start() error {
	life := &liveFS{d: s.disk}
	r, err := extent.OpenOn(life, fmt.Sprintf("shard%d", s.id))
	if err != nil {
		return fmt.Errorf("open shard %d: %w", s.id, err)
	}
	ln, err := transport.ListenOn(s.net, s.addr, s.tls)
	if err != nil {
		r.Close()
		return fmt.Errorf("shard %d: %w", s.id, err)
	}
	srv := downstairs.NewServer(r, downstairs.Config{Workers: 2})
	ctx, cancel := context.WithCancel(context.Background())
	s.life, s.ln, s.stop, s.done = life, ln, cancel, make(chan struct{})
	go func() {
		defer close(s.done)
		_ = srv.Serve(ctx, ln)
		_ = r.Close()
	}()
	return nil
}

// up reports whether the shard's downstairs runs.
func (s *ecShard) up() bool { return s.life != nil }

// crash stops the downstairs. With power lost, it stops at once: the
// disk keeps only what was synced and a random prefix (pick) of the
// rest, the last write kept maybe torn, and nothing the dying server
// still does reaches it. Without (its process killed), it goes off the
// network at once and the jobs it had begun complete on the disk, whose
// writes all survive, so a block is never left with its data and hash
// at odds: as in the replicated simulation, damage to blocks on several
// shards at once would be several failures.
func (s *ecShard) crash(pick func(int) int, power bool) {
	if !s.up() {
		return
	}
	if power {
		s.life.dead.Store(true)
		s.disk.crash(pick, true)
	}
	s.halt()
}

// halt ends the downstairs' sockets and goroutines and waits for them.
func (s *ecShard) halt() {
	if !s.up() {
		return
	}
	s.ln.Close()
	s.stop()
	<-s.done
	s.life = nil
}
