package control

import (
	"context"
	"errors"
	"testing"
	"time"

	"tern/control/controlapi"

	"go.etcd.io/etcd/client/v3/concurrency"
)

func testStore(t *testing.T) *Store {
	t.Helper()
	e, err := StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return NewStore(e.Client, "/tern-test/")
}

// TestCommitIsConditionedOnTheRevisionRead writes a record twice from the
// same read: the second writer conflicts and changes nothing.
func TestCommitIsConditionedOnTheRevisionRead(t *testing.T) {
	s := testStore(t)
	ctx := context.Background()
	if err := s.Commit(ctx, Put(kindHost, "h1", &controlapi.Host{ID: "h1", State: controlapi.HostActive}, 0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, Put(kindHost, "h1", &controlapi.Host{ID: "h1"}, 0)); !errors.Is(err, ErrConflict) {
		t.Fatalf("creating an existing record: %v, want ErrConflict", err)
	}
	cur, err := Get[controlapi.Host](ctx, s, kindHost, "h1")
	if err != nil {
		t.Fatal(err)
	}
	a, b := cur.Value, cur.Value
	a.State, b.State = controlapi.HostDraining, controlapi.HostDrained
	if err := s.Commit(ctx, Put(kindHost, "h1", &a, cur.Rev)); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, Put(kindHost, "h1", &b, cur.Rev), Put(kindHost, "h2", &controlapi.Host{ID: "h2"}, 0)); !errors.Is(err, ErrConflict) {
		t.Fatalf("a stale write: %v, want ErrConflict", err)
	}
	got, _ := Get[controlapi.Host](ctx, s, kindHost, "h1")
	if got.Value.State != controlapi.HostDraining {
		t.Fatalf("state %s after a stale write; want draining", got.Value.State)
	}
	if _, err := Get[controlapi.Host](ctx, s, kindHost, "h2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the failed transaction's other write landed: %v", err)
	}
}

// TestEmbeddedEtcdKeepsRecordsAcrossRestart reopens the data dir.
func TestEmbeddedEtcdKeepsRecordsAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	e, err := StartEmbedded(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := NewStore(e.Client, "/t/").Commit(ctx, Put(kindHost, "h1", &controlapi.Host{ID: "h1", Address: "a"}, 0)); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e, err = StartEmbedded(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	got, err := Get[controlapi.Host](ctx, NewStore(e.Client, "/t/"), kindHost, "h1")
	if err != nil || got.Value.Address != "a" {
		t.Fatalf("after restart: %+v, %v", got, err)
	}
}

// TestCommitOfADeposedLeaderChangesNothing elects a leader, fences its
// store on the election key, lets a second process take over (the first
// one's lease revoked), and checks the first one's writes are refused
// with ErrNotLeader while the new leader's, fenced on its own key, land.
func TestCommitOfADeposedLeaderChangesNothing(t *testing.T) {
	e, err := StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	ctx := context.Background()
	campaign := func(who string) (*Store, *concurrency.Session) {
		sess, err := concurrency.NewSession(e.Client, concurrency.WithTTL(sessionTTL))
		if err != nil {
			t.Fatal(err)
		}
		el := concurrency.NewElection(sess, "/tern-test/leader")
		if err := el.Campaign(ctx, who); err != nil {
			t.Fatal(err)
		}
		s := NewStore(e.Client, "/tern-test/")
		s.fence(el.Key(), el.Rev())
		return s, sess
	}
	old, oldSess := campaign("a")
	if err := old.Commit(ctx, Put(kindHost, "h1", &controlapi.Host{ID: "h1", State: controlapi.HostActive}, 0)); err != nil {
		t.Fatalf("the leader's write: %v", err)
	}
	oldSess.Close() // its lease ends, as when it loses etcd for the TTL
	leader, sess := campaign("b")
	defer sess.Close()
	cur, err := Get[controlapi.Host](ctx, old, kindHost, "h1")
	if err != nil {
		t.Fatal(err)
	}
	stale := cur.Value
	stale.State = controlapi.HostDrained
	if err := old.Commit(ctx, Put(kindHost, "h1", &stale, cur.Rev)); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("the deposed leader's write: %v, want ErrNotLeader", err)
	}
	fresh := cur.Value
	fresh.State = controlapi.HostDraining
	if err := leader.Commit(ctx, Put(kindHost, "h1", &fresh, cur.Rev)); err != nil {
		t.Fatalf("the new leader's write: %v", err)
	}
	if err := leader.Commit(ctx, Put(kindHost, "h1", &fresh, cur.Rev)); !errors.Is(err, ErrConflict) {
		t.Fatalf("the new leader's stale write: %v, want ErrConflict", err)
	}
	got, err := Get[controlapi.Host](ctx, leader, kindHost, "h1")
	if err != nil || got.Value.State != controlapi.HostDraining {
		t.Fatalf("the record: %+v, %v; want the new leader's", got.Value, err)
	}
}

// TestStoreOnAnUnreachableEtcdSaysSoWithinItsBound asks a store whose
// etcd member is gone for a record: the answer is ErrEtcdUnavailable,
// not a hang.
func TestStoreOnAnUnreachableEtcdSaysSoWithinItsBound(t *testing.T) {
	e, err := StartEmbedded(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	cli, err := Connect(e.etcd.Clients[0].Addr().String())
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	defer cli.Close()
	e.Close()
	s := NewStore(cli, "/tern-test/")
	s.opWait = time.Second
	err = s.Commit(context.Background(), Put(kindHost, "h1", &controlapi.Host{ID: "h1"}, 0))
	if !errors.Is(err, ErrEtcdUnavailable) {
		t.Fatalf("a write with etcd gone: %v, want ErrEtcdUnavailable", err)
	}
	if _, err := Get[controlapi.Host](context.Background(), s, kindHost, "h1"); !errors.Is(err, ErrEtcdUnavailable) {
		t.Fatalf("a read with etcd gone: %v, want ErrEtcdUnavailable", err)
	}
}
