package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// ErrNotFound is a record that does not exist.
var ErrNotFound = errors.New("no such record")

// ErrConflict is a transaction whose condition failed: some record it
// read changed meanwhile. Callers re-read and retry.
var ErrConflict = errors.New("record changed concurrently")

// Record kinds: each is a key prefix under the store's root.
const (
	kindHost      = "hosts"
	kindInstance  = "instances"
	kindVMM       = "vmms"
	kindMigration = "migrations"
	kindRegion    = "regions"
	kindV2P       = "v2p"
	kindSaga      = "sagas"
	kindDrain     = "drains"
)

// ErrEtcdUnavailable is etcd not answering within storeOpWait: its
// cluster has no quorum, or none of its members is reachable.
var ErrEtcdUnavailable = errors.New("etcd did not answer: is a quorum of its members up and reachable?")

// ErrNotLeader is a write by a control process whose leadership ended
// (its election key is gone): the new leader redoes it from the records.
var ErrNotLeader = errors.New("this control process no longer leads")

// storeOpWait bounds every etcd read and write: without a quorum etcd
// never answers, and a caller must hear so.
const storeOpWait = 10 * time.Second

// Store keeps records as JSON values in etcd under root.
type Store struct {
	cli  *clientv3.Client
	root string
	// opWait bounds each etcd call (storeOpWait; tests shorten it).
	opWait time.Duration

	mu sync.Mutex
	// fenceKey and fenceRev are the leader's election key and its
	// create revision (guarded by mu): while set, every Commit also
	// requires the key to exist still at that revision, so a deposed
	// leader's write changes nothing.
	fenceKey string
	fenceRev int64
}

// NewStore returns a store of records under root ("/tern/") in cli.
func NewStore(cli *clientv3.Client, root string) *Store {
	return &Store{cli: cli, root: strings.TrimRight(root, "/") + "/", opWait: storeOpWait}
}

// fence conditions every later Commit on the election key key still
// having create revision rev ("" lifts it).
func (s *Store) fence(key string, rev int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fenceKey, s.fenceRev = key, rev
}

// opContext bounds one etcd call by the store's opWait.
func (s *Store) opContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.opWait)
}

// retryUnavailable calls txn until it returns anything but etcd having
// no leader or no reachable member (a member died, an election runs), or
// ctx ends. A transaction retried after it did apply fails its revision
// condition the second time: ErrConflict, never a double write.
func retryUnavailable(ctx context.Context, txn func() error) error {
	backoff := 50 * time.Millisecond
	for {
		err := txn()
		if err == nil || !(status.Code(err) == codes.Unavailable || errors.Is(err, rpctypes.ErrNoLeader)) {
			return err
		}
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			return err
		}
		backoff = min(2*backoff, time.Second)
	}
}

// etcdErr names etcd's unavailability in err when the call ran out of
// its own time (not the caller's) or found no member to talk to.
func (s *Store) etcdErr(ctx, opCtx context.Context, err error) error {
	if err == nil {
		return nil
	}
	code := status.Code(err)
	switch {
	case ctx.Err() != nil:
		return err
	case opCtx.Err() != nil, errors.Is(err, context.DeadlineExceeded), code == codes.Unavailable, code == codes.DeadlineExceeded,
		errors.Is(err, rpctypes.ErrNoLeader), errors.Is(err, rpctypes.ErrTimeout), errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail):
		return fmt.Errorf("%w (within %v: %v)", ErrEtcdUnavailable, s.opWait, err)
	}
	return err
}

func (s *Store) key(kind, id string) string { return s.root + kind + "/" + id }

// Versioned is a record with the mod revision it was read at (0: it did
// not exist).
type Versioned[T any] struct {
	Value T
	Rev   int64
}

// Get reads one record.
func Get[T any](ctx context.Context, s *Store, kind, id string) (Versioned[T], error) {
	var out Versioned[T]
	octx, cancel := s.opContext(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.key(kind, id))
	if err = s.etcdErr(ctx, octx, err); err != nil {
		return out, fmt.Errorf("reading %s/%s: %w", kind, id, err)
	}
	if len(resp.Kvs) == 0 {
		return out, fmt.Errorf("%s/%s: %w", kind, id, ErrNotFound)
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &out.Value); err != nil {
		return out, fmt.Errorf("decoding %s/%s: %w", kind, id, err)
	}
	out.Rev = resp.Kvs[0].ModRevision
	return out, nil
}

// List reads every record of kind, in key order.
func List[T any](ctx context.Context, s *Store, kind string) ([]Versioned[T], error) {
	octx, cancel := s.opContext(ctx)
	defer cancel()
	resp, err := s.cli.Get(octx, s.root+kind+"/", clientv3.WithPrefix())
	if err = s.etcdErr(ctx, octx, err); err != nil {
		return nil, fmt.Errorf("listing %s: %w", kind, err)
	}
	out := make([]Versioned[T], 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var v Versioned[T]
		if err := json.Unmarshal(kv.Value, &v.Value); err != nil {
			return nil, fmt.Errorf("decoding %s: %w", kv.Key, err)
		}
		v.Rev = kv.ModRevision
		out = append(out, v)
	}
	return out, nil
}

// Write is one record change of a Commit: Value nil deletes. Rev is the
// mod revision the record must still have (0: it must not exist);
// Unconditional skips the check.
type Write struct {
	Kind, ID      string
	Value         any
	Rev           int64
	Unconditional bool
}

// Put is a Write of v conditioned on rev.
func Put(kind, id string, v any, rev int64) Write {
	return Write{Kind: kind, ID: id, Value: v, Rev: rev}
}

// Commit applies writes in one transaction, only if every record still
// has the revision it was read at; otherwise it changes nothing and
// returns ErrConflict.
func (s *Store) Commit(ctx context.Context, writes ...Write) error {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for _, w := range writes {
		k := s.key(w.Kind, w.ID)
		if !w.Unconditional {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", w.Rev))
		}
		if w.Value == nil {
			ops = append(ops, clientv3.OpDelete(k))
			continue
		}
		b, err := json.Marshal(w.Value)
		if err != nil {
			return fmt.Errorf("encoding %s/%s: %w", w.Kind, w.ID, err)
		}
		ops = append(ops, clientv3.OpPut(k, string(b)))
	}
	s.mu.Lock()
	fenceKey, fenceRev := s.fenceKey, s.fenceRev
	s.mu.Unlock()
	octx, cancel := s.opContext(ctx)
	defer cancel()
	if fenceKey == "" {
		var resp *clientv3.TxnResponse
		err := retryUnavailable(octx, func() (err error) {
			resp, err = s.cli.Txn(octx).If(cmps...).Then(ops...).Commit()
			return err
		})
		if err = s.etcdErr(ctx, octx, err); err != nil {
			return fmt.Errorf("committing records: %w", err)
		}
		if !resp.Succeeded {
			return ErrConflict
		}
		return nil
	}
	// The records' transaction nested in the leadership's: the outer
	// condition says whether this process still leads, the inner one
	// whether the records are as read.
	var resp *clientv3.TxnResponse
	err := retryUnavailable(octx, func() (err error) {
		resp, err = s.cli.Txn(octx).If(clientv3.Compare(clientv3.CreateRevision(fenceKey), "=", fenceRev)).
			Then(clientv3.OpTxn(cmps, ops, nil)).Commit()
		return err
	})
	if err = s.etcdErr(ctx, octx, err); err != nil {
		return fmt.Errorf("committing records: %w", err)
	}
	if !resp.Succeeded {
		return ErrNotLeader
	}
	if !resp.Responses[0].GetResponseTxn().Succeeded {
		return ErrConflict
	}
	return nil
}

// Update reads a record, lets change modify it (or return an error to
// abandon), and commits it conditioned on the revision read, retrying on
// conflicts. A missing record reaches change as the zero value with
// exists false.
func Update[T any](ctx context.Context, s *Store, kind, id string, change func(v *T, exists bool) error) (T, error) {
	for {
		cur, err := Get[T](ctx, s, kind, id)
		exists := err == nil
		if err != nil && !errors.Is(err, ErrNotFound) {
			return cur.Value, err
		}
		v := cur.Value
		if err := change(&v, exists); err != nil {
			return v, err
		}
		err = s.Commit(ctx, Put(kind, id, &v, cur.Rev))
		if errors.Is(err, ErrConflict) {
			continue
		}
		return v, err
	}
}

// Watch returns a channel closed by the first change to the record
// after rev (or when ctx ends).
func (s *Store) Watch(ctx context.Context, kind, id string, rev int64) <-chan struct{} {
	done := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	wc := s.cli.Watch(wctx, s.key(kind, id), clientv3.WithRev(rev+1))
	go func() {
		defer cancel()
		defer close(done)
		for resp := range wc {
			if len(resp.Events) > 0 || resp.Err() != nil {
				return
			}
		}
	}()
	return done
}
