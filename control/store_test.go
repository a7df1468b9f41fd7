package control

import (
	"context"
	"errors"
	"testing"
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
	if err := s.Commit(ctx, Put(kindHost, "h1", &Host{ID: "h1", State: HostActive}, 0)); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, Put(kindHost, "h1", &Host{ID: "h1"}, 0)); !errors.Is(err, ErrConflict) {
		t.Fatalf("creating an existing record: %v, want ErrConflict", err)
	}
	cur, err := Get[Host](ctx, s, kindHost, "h1")
	if err != nil {
		t.Fatal(err)
	}
	a, b := cur.Value, cur.Value
	a.State, b.State = HostDraining, HostDrained
	if err := s.Commit(ctx, Put(kindHost, "h1", &a, cur.Rev)); err != nil {
		t.Fatal(err)
	}
	if err := s.Commit(ctx, Put(kindHost, "h1", &b, cur.Rev), Put(kindHost, "h2", &Host{ID: "h2"}, 0)); !errors.Is(err, ErrConflict) {
		t.Fatalf("a stale write: %v, want ErrConflict", err)
	}
	got, _ := Get[Host](ctx, s, kindHost, "h1")
	if got.Value.State != HostDraining {
		t.Fatalf("state %s after a stale write; want draining", got.Value.State)
	}
	if _, err := Get[Host](ctx, s, kindHost, "h2"); !errors.Is(err, ErrNotFound) {
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
	if err := NewStore(e.Client, "/t/").Commit(ctx, Put(kindHost, "h1", &Host{ID: "h1", Address: "a"}, 0)); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e, err = StartEmbedded(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	got, err := Get[Host](ctx, NewStore(e.Client, "/t/"), kindHost, "h1")
	if err != nil || got.Value.Address != "a" {
		t.Fatalf("after restart: %+v, %v", got, err)
	}
}
