package fixes

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestUndoIsRestored(t *testing.T) {
	for _, f := range All() {
		if Undone(f) {
			t.Fatalf("%v is undone before any test undid it", f)
		}
		restore := Undo(f)
		if !Undone(f) {
			t.Errorf("Undo(%v) did not undo it", f)
		}
		restore()
		if Undone(f) {
			t.Errorf("%v stays undone after its restore", f)
		}
		if strings.HasSuffix(f.String(), "?") {
			t.Errorf("fix %d has no name", f)
		}
	}
}

// TestOnlyTestsUndoAFix: production code never undoes a fix.
func TestOnlyTestsUndoAFix(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("module root not found from %s: %v", root, err)
	}
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		if strings.Contains(string(src), "fixes.Undo(") {
			t.Errorf("%s undoes a fix outside a test", path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 100 {
		t.Fatalf("checked only %d Go files: not the module?", checked)
	}
}
