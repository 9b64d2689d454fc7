package recorded

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"

	"github.com/sparsegrad/sparsegrad/internal/atomicfile"
)

// Writer writes a recording of float32 gradients (train -record-gradients).
// Every rank writes its own files (Write); one of them commits the steps
// that every rank has written (Commit), which rewrites the manifest. Files
// and manifest are replaced atomically (package atomicfile), so a reader
// never sees half a file.
type Writer struct {
	dir string
	mu  sync.Mutex
	m   Manifest
}

// Create starts a recording in dir (created if missing) described by m
// (Format, Version, Files, N and the offsets are filled in; Steps is 0 until
// Commit). A folder that already holds a recording is refused.
func Create(dir string, m Manifest) (*Writer, error) {
	if _, err := os.Stat(filepath.Join(dir, ManifestName)); err == nil {
		return nil, fmt.Errorf("recorded: %s already holds a recording (%s); record into another folder or delete it", dir, ManifestName)
	}
	w, err := NewWriter(dir, m)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("recorded: %w", err)
	}
	return w, nil
}

// NewWriter returns a writer of the files of a recording that another
// writer created (the other ranks of a job: each writes its own files,
// rank 0 creates and commits); it touches nothing on disk.
func NewWriter(dir string, m Manifest) (*Writer, error) {
	m.Format, m.Version, m.Files, m.Steps = FormatName, Version, FilePattern, 0
	off := 0
	for i := range m.Params {
		m.Params[i].Offset = off
		if m.Params[i].DType == "" {
			m.Params[i].DType = F32
		}
		off += m.Params[i].Size
	}
	m.N = off
	if err := m.Check(filepath.Join(dir, ManifestName)); err != nil {
		return nil, err
	}
	return &Writer{dir: dir, m: m}, nil
}

// OpenWriter continues a recording that Create started in dir (a resumed run):
// its manifest is kept, and steps after the committed ones are written
// again.
func OpenWriter(dir string) (*Writer, error) {
	p := filepath.Join(dir, ManifestName)
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("recorded: %w", err)
	}
	m, err := ParseManifest(b, p)
	if err != nil {
		return nil, err
	}
	return &Writer{dir: dir, m: m}, nil
}

// Manifest returns a copy of the manifest as last committed or created.
func (w *Writer) Manifest() Manifest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.m
}

// Write writes rank's gradient of step (from 1), N float32s in layout
// order.
func (w *Writer) Write(step, rank int, grad []float32) error {
	if len(grad) != w.m.N {
		return fmt.Errorf("recorded: a gradient of %d elements; the recording's has %d", len(grad), w.m.N)
	}
	path := filepath.Join(w.dir, fmt.Sprintf(FilePattern, step, rank))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("recorded: %w", err)
	}
	names := make([]string, len(w.m.Params))
	shapes := make([][]int, len(w.m.Params))
	for i, p := range w.m.Params {
		names[i], shapes[i] = p.Name, p.Shape
	}
	err := atomicfile.Write(path, func(f io.Writer) error {
		bw := bufio.NewWriterSize(f, 1<<20)
		if err := WriteFloat32s(bw, names, shapes, grad, nil); err != nil {
			return err
		}
		return bw.Flush()
	})
	if err != nil {
		return fmt.Errorf("recorded: writing %s: %w", path, err)
	}
	return nil
}

// Commit records that steps 1..steps are written by every rank, with the
// step time measured so far, and rewrites the manifest.
func (w *Writer) Commit(steps int, st StepTime) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if steps < w.m.Steps {
		return nil
	}
	w.m.Steps, w.m.StepTime = steps, st
	if err := atomicfile.WriteJSON(filepath.Join(w.dir, ManifestName), w.m); err != nil {
		return fmt.Errorf("recorded: %w", err)
	}
	return nil
}
