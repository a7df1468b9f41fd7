package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
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

// Store keeps records as JSON values in etcd under root.
type Store struct {
	cli  *clientv3.Client
	root string
}

// NewStore returns a store of records under root ("/tern/") in cli.
func NewStore(cli *clientv3.Client, root string) *Store {
	return &Store{cli: cli, root: strings.TrimRight(root, "/") + "/"}
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
	resp, err := s.cli.Get(ctx, s.key(kind, id))
	if err != nil {
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
	resp, err := s.cli.Get(ctx, s.root+kind+"/", clientv3.WithPrefix())
	if err != nil {
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
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("committing records: %w", err)
	}
	if !resp.Succeeded {
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
