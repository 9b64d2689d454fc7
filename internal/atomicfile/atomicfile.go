// Package atomicfile owns the one way the project replaces a file: the new
// content goes to a temporary file in the same folder, which is synced,
// closed and renamed over the path, and the folder is synced. A reader sees
// the old content or the new, never part of either; a crash or a full disk
// leaves the old one and no temporary file (unless the process dies between
// creating and removing it: then a hidden ".NAME.tmp…" file stays). The
// file gets mode 0644. A leaf.
package atomicfile

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
)

// Write replaces the file at path with what write writes. On an error the
// file is as it was and no temporary file is left.
func Write(path string, write func(io.Writer) error) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	ok := false
	defer func() {
		if !ok {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	ok = true
	return syncDir(dir)
}

// WriteFile replaces the file at path with b, as Write.
func WriteFile(path string, b []byte) error {
	return Write(path, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}

// WriteJSON replaces the file at path with v as indented JSON and a final
// newline, as Write.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteFile(path, append(b, '\n'))
}

// syncDir makes a folder's entries (a rename, a new file) durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil && !errors.Is(err, os.ErrInvalid) {
		return err
	}
	return nil
}
