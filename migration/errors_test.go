package migration

import (
	"encoding/json"
	"errors"
	"testing"

	"tern/instance/apiv1"
)

func TestInjectorSpecFromJSONFailsTheNextN(t *testing.T) {
	var spec InjectorSpec
	if err := json.Unmarshal([]byte(`{"phase":"ram_push_dirty","fail_exports":2,"fail_imports":1}`), &spec); err != nil {
		t.Fatal(err)
	}
	inj := NewInjector(spec)
	for i, want := range []bool{true, true, false} {
		if err := inj.failExport(apiv1.PhaseRAMPushDirty); errors.Is(err, ErrInjected) != want {
			t.Fatalf("export %d: %v", i, err)
		}
	}
	if err := inj.failImport(apiv1.PhaseDevice); err != nil {
		t.Fatalf("import at another phase: %v", err)
	}
	if err := inj.failImport(apiv1.PhaseRAMPushDirty); !errors.Is(err, ErrInjected) {
		t.Fatalf("import: %v", err)
	}
	var none *Injector
	if none.failExport(apiv1.PhaseSync) != nil || none.failImport(apiv1.PhaseSync) != nil {
		t.Fatal("a nil injector injected")
	}
	if err := json.Unmarshal([]byte(`{"phase":"nap"}`), &spec); err == nil {
		t.Fatal("an unknown phase parsed")
	}
}
