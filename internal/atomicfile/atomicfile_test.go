package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// TestWrite: a write that fails (the writer's error, a rename over a
// folder) leaves the file as it was and no temporary file behind; a good
// one replaces it, with mode 0644.
func TestWrite(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	if err := WriteFile(p, []byte("one")); err != nil {
		t.Fatal(err)
	}
	full := errors.New("no space left")
	if err := Write(p, func(w io.Writer) error {
		w.Write([]byte("tw"))
		return full
	}); !errors.Is(err, full) {
		t.Fatalf("the writer's error lost: %v", err)
	}
	// A folder where the file should be: the rename fails.
	q := filepath.Join(dir, "d")
	os.MkdirAll(filepath.Join(q, "x"), 0o755)
	if err := WriteFile(q, []byte("x")); err == nil {
		t.Fatal("renaming over a folder succeeded")
	}
	if b, _ := os.ReadFile(p); string(b) != "one" {
		t.Fatalf("file holds %q", b)
	}
	if err := WriteJSON(p, map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "{\n  \"a\": 1\n}\n" {
		t.Fatalf("file holds %q", b)
	}
	if st, err := os.Stat(p); err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("mode %v (%v), want 0644", st.Mode(), err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("left in the folder: %v", ents)
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), nil); err == nil {
		t.Fatal("a file in a missing folder written")
	}
}
