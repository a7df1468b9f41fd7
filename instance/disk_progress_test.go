package instance

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"tern/volume/reconcile"
)

// TestRepairProgressKeepsEveryField checks that the API's copy of a
// planner progress has the same JSON as the planner's own, field for
// field, so that a field added to one and not the other fails here.
func TestRepairProgressKeepsEveryField(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC)
	p := reconcile.Progress{Phase: reconcile.PhaseLiveRepair, ExtentsTotal: 1, ExtentsDone: 2, BlocksCompared: 3,
		BytesTotal: 4, BytesDone: 5, BytesPerSec: 6, EtaSeconds: 7, StartedAt: at, UpdatedAt: at.Add(time.Second)}
	if n := reflect.TypeFor[reconcile.Progress]().NumField(); n != 10 {
		t.Fatalf("reconcile.Progress has %d fields; repairProgress copies 10", n)
	}
	want, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(repairProgress(&p))
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("API progress %s; want the planner's %s", got, want)
	}
	if repairProgress(nil) != nil {
		t.Fatal("repairProgress(nil) is not nil")
	}
}
