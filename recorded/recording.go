package recorded

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/layout"
)

// FormatName and Version identify a manifest of this format.
const (
	FormatName = "sparsegrad-gradients"
	Version    = 1
	// ManifestName is the manifest's file name in a recording's folder.
	ManifestName = "manifest.json"
	// FilePattern is the path of step s's (from 1) file of rank r (from 0).
	FilePattern = "step-%06d/rank-%05d.safetensors"
)

// Param is one parameter tensor of the recorded model, in layout order.
type Param struct {
	layout.Tensor
	// DType is the type its gradient is stored as (F32, F16, BF16, F64).
	DType DType `json:"dtype"`
}

// StepTime is the measured time of one worker's forward and backward pass.
type StepTime struct {
	// Seconds is the median over the measured steps.
	Seconds float64 `json:"seconds"`
	// Samples are the measured times (seconds), in order.
	Samples []float64 `json:"samples,omitempty"`
	// Device is where the model ran ("cpu", "cuda:0 (NVIDIA A100-SXM4-80GB)").
	Device string `json:"device"`
	// Note says what else the time includes, if anything (under DDP: the
	// all-reduce's wait).
	Note string `json:"note,omitempty"`
}

// Manifest is a recording's manifest.json.
type Manifest struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// Model names the recorded model (the user's name for it).
	Model string `json:"model"`
	// Source is what recorded it: "pytorch" or "sparsegrad".
	Source string `json:"source"`
	// Mode is how the workers were had: "simulated" (P mini-batches of
	// each step at the same parameters, one process, the update made with
	// their mean), "ddp" (the ranks of a DistributedDataParallel job, each
	// rank's gradient before the all-reduce) or "train" (train's workers,
	// -record-gradients).
	Mode string `json:"mode"`
	// Workers is P and Steps the number of complete steps recorded (S).
	Workers int `json:"workers"`
	Steps   int `json:"steps"`
	// Batch is one worker's mini-batch size (0: not known).
	Batch int `json:"batch"`
	// StepsPerEpoch is the recorded training's steps per epoch (0: not
	// known); a replay's epoch-based schedules (DGC's density warm-up)
	// count epochs with it.
	StepsPerEpoch int `json:"steps_per_epoch,omitempty"`
	// StepTime is one worker's measured forward and backward time.
	StepTime StepTime `json:"step_time"`
	// Params are the model's parameter tensors in layout order, N their
	// total size.
	Params []Param `json:"params"`
	N      int     `json:"n"`
	// Files is FilePattern.
	Files string `json:"files"`
	// Software names what recorded it and its versions (e.g. "torch":
	// "2.3.1", "python": "3.11.2", or "sparsegrad": the revision).
	Software map[string]string `json:"software,omitempty"`
	// Created is when the recording started.
	Created time.Time `json:"created"`
	// Run is what recorded the steps when train did (its configuration,
	// as run.json has it), nil otherwise.
	Run json.RawMessage `json:"run,omitempty"`
}

// Check checks a manifest's own consistency; where is named in errors.
func (m *Manifest) Check(where string) error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrFormat, where, fmt.Sprintf(format, a...))
	}
	if m.Format != FormatName {
		return bad("format %q, not %q: not a recording of gradients (record one with python/sparsegrad_record.py or train -record-gradients)", m.Format, FormatName)
	}
	if m.Version != Version {
		return bad("version %d; this build reads version %d", m.Version, Version)
	}
	if m.Files != FilePattern {
		return bad("files %q; this build reads %q", m.Files, FilePattern)
	}
	if m.Workers < 1 || m.Workers > 1<<20 {
		return bad("%d workers: want at least 1", m.Workers)
	}
	if m.Steps < 0 {
		return bad("%d steps", m.Steps)
	}
	if m.Batch < 0 {
		return bad("batch %d", m.Batch)
	}
	if m.StepsPerEpoch < 0 {
		return bad("steps_per_epoch %d: want 0 (not known) or more", m.StepsPerEpoch)
	}
	if s := m.StepTime.Seconds; math.IsNaN(s) || math.IsInf(s, 0) || s < 0 {
		return bad("step time %v seconds", s)
	}
	if len(m.Params) == 0 {
		return bad("no parameters")
	}
	off := 0
	names := map[string]bool{}
	for i, p := range m.Params {
		if p.Name == "" || names[p.Name] {
			return bad("parameter %d has an empty or repeated name %q", i, p.Name)
		}
		names[p.Name] = true
		n := 1
		for _, d := range p.Shape {
			if d < 0 || (d > 0 && n > math.MaxInt32/d) {
				return bad("parameter %s has shape %v", p.Name, p.Shape)
			}
			n *= d
		}
		if n != p.Size || p.Offset != off {
			return bad("parameter %s: shape %v, size %d, offset %d; want size %d at offset %d (the parameters follow one another)", p.Name, p.Shape, p.Size, p.Offset, n, off)
		}
		if p.DType.Size() == 0 {
			return bad("parameter %s has dtype %q; want F32, F16, BF16 or F64", p.Name, p.DType)
		}
		off += n
	}
	if off != m.N {
		return bad("n %d, the parameters hold %d", m.N, off)
	}
	return nil
}

// Recording is an opened recording.
type Recording struct {
	Dir      string
	Manifest Manifest
}

// Open reads and checks dir's manifest, and every recorded file's header
// against it (see checkFile).
func Open(dir string) (*Recording, error) {
	p := filepath.Join(dir, ManifestName)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		if _, serr := os.Stat(dir); serr != nil {
			return nil, fmt.Errorf("recorded: -gradients %s: no such folder; give the folder the recording wrote (python/sparsegrad_record.py or train -record-gradients)", dir)
		}
		return nil, fmt.Errorf("recorded: -gradients %s: no %s there: not a recording of gradients, or one whose first step is not complete yet", dir, ManifestName)
	}
	if err != nil {
		return nil, fmt.Errorf("recorded: %w", err)
	}
	r := &Recording{Dir: dir}
	if r.Manifest, err = ParseManifest(b, p); err != nil {
		return nil, err
	}
	if r.Manifest.Steps < 1 {
		return nil, fmt.Errorf("%w: %s: no complete step recorded yet", ErrFormat, p)
	}
	for s := 1; s <= r.Manifest.Steps; s++ {
		for rank := range r.Manifest.Workers {
			if err := r.checkFile(s, rank); err != nil {
				return nil, err
			}
		}
	}
	return r, nil
}

// checkFile checks that the file of step and rank exists, that its header
// lists as many tensors and elements as the manifest, and that its data
// is all there (a replay finds a file cut short before it starts, not at
// its step, and a manifest of another model before it allocates its
// gradients). It reads the header only.
func (r *Recording) checkFile(step, rank int) error {
	m := &r.Manifest
	path := r.Path(step, rank)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%w: %s lists %d steps of %d workers, but %v", ErrFormat, filepath.Join(r.Dir, ManifestName), m.Steps, m.Workers, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("recorded: %w", err)
	}
	var head [8]byte
	if _, err := io.ReadFull(f, head[:]); err != nil {
		return fmt.Errorf("%w: %s: %d bytes: truncated; record again", ErrFormat, path, st.Size())
	}
	n := binary.LittleEndian.Uint64(head[:])
	b := head[:]
	if n <= maxHeader {
		b = make([]byte, 8+min(int64(n), st.Size()-8))
		copy(b, head[:])
		if _, err := io.ReadFull(f, b[8:]); err != nil {
			return fmt.Errorf("recorded: reading %s: %w", path, err)
		}
	}
	h, err := ParseHeader(b, st.Size())
	if err != nil {
		return fmt.Errorf("%s: %w; record again", path, err)
	}
	var elems int64
	for _, t := range h.Tensors {
		elems += t.Len()
	}
	if len(h.Tensors) != len(m.Params) || elems != int64(m.N) {
		return fmt.Errorf("%w: %s holds %d tensors of %d elements in all; the manifest lists %d parameters of %d: files of another model", ErrFormat, path, len(h.Tensors), elems, len(m.Params), m.N)
	}
	return nil
}

// ParseManifest parses and checks a manifest (the contents of
// manifest.json); where names it in errors.
func ParseManifest(b []byte, where string) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %s is not a valid manifest (%v): a damaged or truncated file; record again, or restore it from a copy", ErrFormat, where, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Manifest{}, fmt.Errorf("%w: %s: data after the manifest's JSON object: a damaged file; record again, or restore it from a copy", ErrFormat, where)
	}
	if err := m.Check(where); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

// Path is the file of step (from 1) of rank (from 0).
func (r *Recording) Path(step, rank int) string {
	return filepath.Join(r.Dir, fmt.Sprintf(FilePattern, step, rank))
}

// Layout is the layout the manifest describes: its tensors and N.
func (m *Manifest) Layout() layout.Layout {
	l := layout.Layout{Tensors: make([]layout.Tensor, len(m.Params)), N: m.N}
	for i, p := range m.Params {
		l.Tensors[i] = p.Tensor
	}
	return l
}

// Reader reads one worker's recorded gradients, reusing its buffer.
type Reader struct {
	rec *Recording
	buf []byte
}

// NewReader returns a reader of r's files.
func (r *Recording) NewReader() *Reader { return &Reader{rec: r} }

// Read reads rank's gradient of step (from 1) into dst (N elements, layout
// order), checking that the file holds every parameter with its shape and
// nothing else.
func (rd *Reader) Read(step, rank int, dst []float32) error {
	m := &rd.rec.Manifest
	if step < 1 || step > m.Steps {
		return fmt.Errorf("recorded: step %d: the recording %s holds steps 1 to %d", step, rd.rec.Dir, m.Steps)
	}
	if rank < 0 || rank >= m.Workers {
		return fmt.Errorf("recorded: rank %d: the recording %s holds workers 0 to %d", rank, rd.rec.Dir, m.Workers-1)
	}
	if len(dst) != m.N {
		return fmt.Errorf("recorded: a gradient of %d elements; the recording's has %d", len(dst), m.N)
	}
	path := rd.rec.Path(step, rank)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("recorded: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("recorded: %w", err)
	}
	size := st.Size()
	if size > 1<<40 {
		return fmt.Errorf("%w: %s: %d bytes", ErrFormat, path, size)
	}
	if int64(cap(rd.buf)) < size {
		rd.buf = make([]byte, size)
	}
	rd.buf = rd.buf[:size]
	if _, err := io.ReadFull(f, rd.buf); err != nil {
		return fmt.Errorf("recorded: reading %s: %w", path, err)
	}
	return DecodeFile(rd.buf, m.Params, dst, path)
}

// DecodeFile decodes a whole safetensors file b holding the gradient of
// params into dst (layout order). name names the file in errors.
func DecodeFile(b []byte, params []Param, dst []float32, name string) error {
	h, err := ParseHeader(b, int64(len(b)))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if len(h.Tensors) != len(params) {
		var extra []string
		for _, t := range h.Tensors {
			if !slices.ContainsFunc(params, func(p Param) bool { return p.Name == t.Name }) {
				extra = append(extra, t.Name)
			}
		}
		if len(extra) > 0 {
			return fmt.Errorf("%w: %s holds %d tensors, the manifest lists %d parameters (not in the manifest: %s)", ErrFormat, name, len(h.Tensors), len(params), strings.Join(extra[:min(len(extra), 3)], ", "))
		}
	}
	data := b[h.DataStart:]
	for _, p := range params {
		t, ok := h.Lookup(p.Name)
		if !ok {
			return fmt.Errorf("%w: %s has no tensor %q (a parameter the manifest lists)", ErrFormat, name, p.Name)
		}
		if t.Len() != int64(p.Size) || !slices.Equal(t.Shape, p.Shape) {
			return fmt.Errorf("%w: %s: tensor %q has shape %v; the manifest says %v", ErrFormat, name, p.Name, t.Shape, p.Shape)
		}
		if err := Decode(dst[p.Offset:p.Offset+p.Size], data[t.Begin:t.End], t.DType); err != nil {
			return fmt.Errorf("%s: tensor %q: %w", name, p.Name, err)
		}
	}
	return nil
}
