package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"tern/agent/agentapi"
)

// TestInventoryLongPollAnswersOnceItChanges asks for an inventory newer
// than the current one, which comes once the agent's inventory changes;
// an inventory newer than 0 comes at once, and a bad after_gen is a 400.
func TestInventoryLongPollAnswersOnceItChanges(t *testing.T) {
	a, err := New(Config{HostID: "h1", DataDir: t.TempDir(), CPUs: 1, MemoryMiB: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	srv := httptest.NewServer(a)
	defer srv.Close()
	c := agentapi.NewClient(srv.URL, nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first, err := c.InventoryAfter(ctx, 0)
	if err != nil || first.Gen == 0 {
		t.Fatalf("the first inventory: %+v, %v", first, err)
	}
	got := make(chan agentapi.Inventory, 1)
	go func() {
		inv, err := c.InventoryAfter(ctx, first.Gen)
		if err != nil {
			t.Error(err)
		}
		got <- inv
	}()
	select {
	case inv := <-got:
		t.Fatalf("answered before any change: %+v", inv)
	case <-time.After(100 * time.Millisecond):
	}
	a.mu.Lock()
	a.registered = true
	a.changedLocked()
	a.mu.Unlock()
	select {
	case inv := <-got:
		if inv.Gen <= first.Gen || !inv.Registered {
			t.Fatalf("after the change: %+v, want a newer generation than %d", inv, first.Gen)
		}
	case <-ctx.Done():
		t.Fatal("the long-poll did not answer the change")
	}
	resp, err := http.Get(srv.URL + "/v1/inventory?after_gen=x")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("after_gen=x: %s, want 400", resp.Status)
	}
}
