package recorded

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/layout"
)

// torchPython returns a Python interpreter that imports torch
// (SPARSEGRAD_PYTHON, then /usr/bin/python3, then python3 on PATH), or ends
// the test through testenv (need torch: CI installs python3-torch and
// requires it).
func torchPython(t *testing.T) string {
	t.Helper()
	var tried []string
	cands := []string{os.Getenv("SPARSEGRAD_PYTHON"), "/usr/bin/python3", "python3"}
	for _, c := range cands {
		if c == "" {
			continue
		}
		out, err := testenv.Command(t, 2*time.Minute, c, "-c", "import torch; print(torch.__version__)").CombinedOutput()
		if err == nil {
			return c
		}
		tried = append(tried, fmt.Sprintf("%s: %v %s", c, err, lastLine(string(out))))
	}
	testenv.Missing(t, testenv.Torch, "no Python with torch ("+strings.Join(tried, "; ")+"); install python3-torch (apt) or set SPARSEGRAD_PYTHON")
	return ""
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// TestReadsPyTorchRecordings records a small Transformer with the Python
// module (float32, bfloat16 and float16 simulated workers, and two DDP ranks
// over gloo) and reads every gradient back bit for bit against torch's own
// float32 values of what was recorded.
func TestReadsPyTorchRecordings(t *testing.T) {
	py := torchPython(t)
	if testing.Short() {
		t.Skip("records with PyTorch (about 10 s); skipped in -short")
	}
	out := t.TempDir()
	cmd := testenv.Command(t, 5*time.Minute, py, "testdata/record_torch.py", "../python", out)
	cmd.Env = append(os.Environ(), fmt.Sprintf("RECORD_TEST_PORT=%d", 20000+rand.IntN(20000)))
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("recording with PyTorch: %v\n%s", err, b)
	}
	for _, c := range []struct {
		name, mode string
		workers    int
		dtype      DType
	}{{"f32", "simulated", 3, F32}, {"bf16", "simulated", 3, BF16}, {"f16", "simulated", 3, F16}, {"ddp", "ddp", 2, F32}} {
		t.Run(c.name, func(t *testing.T) {
			rec, err := Open(filepath.Join(out, c.name))
			if err != nil {
				t.Fatal(err)
			}
			m := rec.Manifest
			perEpoch := 7 // the simulated workers' recordings give it
			if c.mode == "ddp" {
				perEpoch = 0
			}
			if m.Source != "pytorch" || m.Mode != c.mode || m.Workers != c.workers || m.Steps != 2 || m.Batch != 4 || m.Model != "tinylm" || m.StepsPerEpoch != perEpoch {
				t.Fatalf("manifest: source %q mode %q workers %d steps %d batch %d model %q steps per epoch %d", m.Source, m.Mode, m.Workers, m.Steps, m.Batch, m.Model, m.StepsPerEpoch)
			}
			if !(m.StepTime.Seconds > 0) || m.StepTime.Device != "cpu" || m.Software["torch"] == "" {
				t.Errorf("step time %+v, software %v", m.StepTime, m.Software)
			}
			var names []string
			for _, p := range m.Params {
				names = append(names, p.Name)
				if p.DType != c.dtype {
					t.Errorf("%s recorded as %s, want %s", p.Name, p.DType, c.dtype)
				}
			}
			if names[0] != "emb.weight" || strings.Contains(strings.Join(names, ","), "frozen") || !strings.Contains(strings.Join(names, ","), "unused.weight") {
				t.Errorf("parameters %v: want named_parameters' order from emb.weight, unused.* in, frozen out", names)
			}
			rd := rec.NewReader()
			got := make([]float32, m.N)
			var first []float32
			for s := 1; s <= 2; s++ {
				for r := range c.workers {
					if err := rd.Read(s, r, got); err != nil {
						t.Fatal(err)
					}
					want := readRaw(t, filepath.Join(rec.Dir, "truth", fmt.Sprintf("step-%d-rank-%d.f32", s, r)))
					if len(want) != m.N {
						t.Fatalf("truth of %d elements, manifest n %d", len(want), m.N)
					}
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("step %d rank %d element %d: read %v (%#x), PyTorch recorded %v (%#x)", s, r, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
						}
					}
					if first == nil {
						first = append([]float32(nil), got...)
					} else if equalBits(first, got) {
						t.Fatalf("step %d rank %d: the same gradient as step 1 rank 0 (the workers' batches must differ)", s, r)
					}
					u, _ := lookupParam(m.Params, "unused.weight")
					for _, v := range got[u.Offset : u.Offset+u.Size] {
						if v != 0 {
							t.Fatalf("unused.weight has gradient %v, want zeros", v)
						}
					}
				}
			}
		})
	}
}

func lookupParam(ps []Param, name string) (Param, bool) {
	for _, p := range ps {
		if p.Name == name {
			return p, true
		}
	}
	return Param{}, false
}

func equalBits(a, b []float32) bool {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

func readRaw(t *testing.T, path string) []float32 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

// halfRef is binary16's value from its definition, in float64.
func halfRef(h uint16) float64 {
	s := 1.0
	if h&0x8000 != 0 {
		s = -1
	}
	e := int(h>>10) & 0x1f
	m := float64(h & 0x3ff)
	switch e {
	case 0:
		return s * m * math.Pow(2, -24)
	case 31:
		if m == 0 {
			return s * math.Inf(1)
		}
		return math.NaN()
	}
	return s * (1 + m/1024) * math.Pow(2, float64(e-15))
}

// TestHalfToFloat32 checks every binary16 value against its definition,
// and a few by their known values.
func TestHalfToFloat32(t *testing.T) {
	for h := 0; h < 1<<16; h++ {
		got, want := HalfToFloat32(uint16(h)), halfRef(uint16(h))
		if math.IsNaN(want) {
			if !math.IsNaN(float64(got)) {
				t.Fatalf("%#04x: %v, want NaN", h, got)
			}
			continue
		}
		if float64(got) != want || math.Signbit(float64(got)) != math.Signbit(want) {
			t.Fatalf("%#04x: %v, want %v", h, got, want)
		}
	}
	for _, c := range []struct {
		h    uint16
		want float32
	}{{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, 5.960464477539063e-08}, {0x0400, 6.103515625e-05}, {0x3555, 0.333251953125}} {
		if got := HalfToFloat32(c.h); got != c.want {
			t.Errorf("%#04x: %v, want %v", c.h, got, c.want)
		}
	}
}

// file builds a safetensors file from a header object and data.
func file(header string, data []byte) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	return append(append(b, header...), data...)
}

func TestDecodeTypes(t *testing.T) {
	params := []Param{{Tensor: layout.Tensor{Name: "a", Shape: []int{2}, Size: 2}, DType: BF16}, {Tensor: layout.Tensor{Name: "b", Shape: []int{1, 2}, Offset: 2, Size: 2}, DType: F16},
		{Tensor: layout.Tensor{Name: "c", Shape: []int{}, Offset: 4, Size: 1}, DType: F32}, {Tensor: layout.Tensor{Name: "d", Shape: []int{2}, Offset: 5, Size: 2}, DType: F64}}
	var data []byte
	data = binary.LittleEndian.AppendUint16(data, 0x3f80) // bf16 1
	data = binary.LittleEndian.AppendUint16(data, 0xc0a0) // bf16 -5
	data = binary.LittleEndian.AppendUint16(data, 0x3c00) // f16 1
	data = binary.LittleEndian.AppendUint16(data, 0x0001) // f16 2^-24
	data = binary.LittleEndian.AppendUint32(data, math.Float32bits(-0.75))
	data = binary.LittleEndian.AppendUint64(data, math.Float64bits(0.1))
	data = binary.LittleEndian.AppendUint64(data, math.Float64bits(-1e300))
	hdr := `{"c":{"dtype":"F32","shape":[],"data_offsets":[8,12]},"a":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]},` +
		`"__metadata__":{"k":"v"},"b":{"dtype":"F16","shape":[1,2],"data_offsets":[4,8]},"d":{"dtype":"F64","shape":[2],"data_offsets":[12,28]}}  `
	dst := make([]float32, 7)
	if err := DecodeFile(file(hdr, data), params, dst, "t"); err != nil {
		t.Fatal(err)
	}
	want := []float32{1, -5, 1, float32(math.Ldexp(1, -24)), -0.75, 0.1, float32(math.Inf(-1))}
	for i := range want {
		if math.Float32bits(dst[i]) != math.Float32bits(want[i]) {
			t.Errorf("element %d: %v, want %v", i, dst[i], want[i])
		}
	}
}

// TestBadFiles: every malformed file is refused with an error naming the
// problem.
func TestBadFiles(t *testing.T) {
	params := []Param{{Tensor: layout.Tensor{Name: "w", Shape: []int{2}, Size: 2}, DType: F32}}
	eight := make([]byte, 8)
	for _, c := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "shorter than"},
		{"huge header", binary.LittleEndian.AppendUint64(nil, 1<<40), "more than"},
		{"truncated header", file(`{"w":{}}`, nil)[:12], "truncated"},
		{"not json", file(`[1]`, nil), "does not start with"},
		{"bad json", file(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}`, eight), "header"},
		{"int tensor", file(`{"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}`, eight), "gradients are F32"},
		{"unknown dtype", file(`{"w":{"dtype":"Q9","shape":[1],"data_offsets":[0,8]}}`, eight), "unknown dtype"},
		{"size mismatch", file(`{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, eight), "needs 12 bytes"},
		{"negative dim", file(`{"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}`, eight), "whole number"},
		{"fraction dim", file(`{"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}}`, eight), "whole number"},
		{"reversed", file(`{"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}`, eight), "before it begins"},
		{"hole", file(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), "hole"},
		{"overlap", file(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), "overlaps"},
		{"duplicate", file(`{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}`, eight), "twice"},
		{"short data", file(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, eight[:5]), "truncated"},
		{"extra data", file(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, append(eight, 1)), "after the last tensor"},
		{"trailing junk", file(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}} x`, eight), "not padding"},
		{"bad metadata", file(`{"__metadata__":{"a":1},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, eight), "__metadata__"},
		{"missing tensor", file(`{"v":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, eight), "has no tensor \"w\""},
		{"extra tensor", file(`{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"v":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}`, append(eight, 0, 0, 0, 0)), "not in the manifest: v"},
		{"wrong shape", file(`{"w":{"dtype":"F32","shape":[1,2],"data_offsets":[0,8]}}`, eight), "shape [1 2]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := DecodeFile(c.b, params, make([]float32, 2), "g.safetensors")
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrFormat) {
				t.Fatalf("error %v; want ErrFormat saying %q", err, c.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error of several lines: %q", err)
			}
		})
	}
}

// TestWriterRoundTrip writes a recording with Writer and reads it back,
// for awkward layouts (a scalar, an empty tensor, one element).
func TestWriterRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "rec")
	params := []Param{{Tensor: layout.Tensor{Name: "s", Shape: nil, Size: 1}}, {Tensor: layout.Tensor{Name: "empty", Shape: []int{0, 3}, Size: 0}}, {Tensor: layout.Tensor{Name: "w", Shape: []int{3, 5}, Size: 15}}, {Tensor: layout.Tensor{Name: "b", Shape: []int{1}, Size: 1}}}
	w, err := Create(dir, Manifest{Model: "toy", Source: "sparsegrad", Mode: "train", Workers: 3, Batch: 2, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir); err == nil || !strings.Contains(err.Error(), "no manifest.json") {
		t.Fatalf("a recording without a committed step opened: %v", err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	want := map[[2]int][]float32{}
	for s := 1; s <= 2; s++ {
		for r := range 3 {
			g := make([]float32, 17)
			for i := range g {
				g[i] = float32(rng.NormFloat64())
			}
			g[3] = float32(math.Copysign(0, -1))
			want[[2]int{s, r}] = g
			if err := w.Write(s, r, g); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Commit(s, StepTime{Seconds: 0.5, Device: "cpu"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Create(dir, Manifest{}); err == nil || !strings.Contains(err.Error(), "already holds") {
		t.Fatalf("Create over a recording: %v", err)
	}
	rec, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Manifest.Steps != 2 || rec.Manifest.N != 17 || rec.Manifest.Params[2].Offset != 1 {
		t.Fatalf("manifest %+v", rec.Manifest)
	}
	rd := rec.NewReader()
	got := make([]float32, 17)
	for k, g := range want {
		if err := rd.Read(k[0], k[1], got); err != nil {
			t.Fatal(err)
		}
		if !equalBits(got, g) {
			t.Fatalf("step %d rank %d: read %v, wrote %v", k[0], k[1], got, g)
		}
	}
	for _, c := range []struct{ s, r int }{{0, 0}, {3, 0}, {1, 3}, {1, -1}} {
		if err := rd.Read(c.s, c.r, got); err == nil {
			t.Errorf("Read(%d, %d) of a 2-step, 3-worker recording: no error", c.s, c.r)
		}
	}
	// A file cut short is refused, naming it.
	p := rec.Path(2, 1)
	b, _ := os.ReadFile(p)
	os.WriteFile(p, b[:len(b)-3], 0o644)
	if err := rd.Read(2, 1, got); err == nil || !strings.Contains(err.Error(), "truncated") || !strings.Contains(err.Error(), p) {
		t.Fatalf("a truncated file: %v", err)
	}
}

// TestManifestChecks: manifests that contradict themselves are refused.
func TestManifestChecks(t *testing.T) {
	good := func() Manifest {
		return Manifest{Format: FormatName, Version: Version, Files: FilePattern, Workers: 2, Steps: 1,
			Params: []Param{{Tensor: layout.Tensor{Name: "a", Shape: []int{2}, Size: 2}, DType: F32}, {Tensor: layout.Tensor{Name: "b", Shape: []int{3}, Offset: 2, Size: 3}, DType: BF16}}, N: 5}
	}
	if err := func() *Manifest { m := good(); return &m }().Check("m"); err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]struct {
		edit func(*Manifest)
		want string
	}{
		"format":   {func(m *Manifest) { m.Format = "x" }, "not a recording"},
		"version":  {func(m *Manifest) { m.Version = 2 }, "version 2"},
		"workers":  {func(m *Manifest) { m.Workers = 0 }, "0 workers"},
		"offset":   {func(m *Manifest) { m.Params[1].Offset = 3 }, "offset 3"},
		"size":     {func(m *Manifest) { m.Params[0].Size = 3 }, "size 3"},
		"dtype":    {func(m *Manifest) { m.Params[0].DType = "I8" }, "dtype"},
		"n":        {func(m *Manifest) { m.N = 6 }, "n 6"},
		"repeated": {func(m *Manifest) { m.Params[1].Name = "a" }, "repeated"},
		"time":     {func(m *Manifest) { m.StepTime.Seconds = math.NaN() }, "step time"},
	} {
		m := good()
		c.edit(&m)
		if err := m.Check("m"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error saying %q", name, err, c.want)
		}
	}
	// A manifest on disk that is not JSON.
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, ManifestName), []byte("{"), 0o644)
	if _, err := Open(dir); err == nil || !errors.Is(err, ErrFormat) {
		t.Errorf("a damaged manifest: %v", err)
	}
	// A real recording whose manifest or first file is cut short, or
	// whose manifest has something after it: one line each, naming the
	// file and the fix.
	rec := filepath.Join(t.TempDir(), "rec")
	w, err := Create(rec, Manifest{Model: "toy", Source: "sparsegrad", Mode: "train", Workers: 3, Params: []Param{{Tensor: layout.Tensor{Name: "w", Shape: []int{4, 8}, Size: 32}}}})
	if err != nil {
		t.Fatal(err)
	}
	for r := range 3 {
		if err := w.Write(1, r, make([]float32, 32)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(1, StepTime{}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(rec); err != nil {
		t.Fatal(err)
	}
	mp := filepath.Join(rec, ManifestName)
	man, _ := os.ReadFile(mp)
	first := filepath.Join(rec, fmt.Sprintf(FilePattern, 1, 0))
	data, _ := os.ReadFile(first)
	middle := filepath.Join(rec, fmt.Sprintf(FilePattern, 1, 1))
	var other Manifest
	json.Unmarshal(man, &other)
	other.Params[0].Shape, other.Params[0].Size, other.N = []int{1 << 20, 8}, 8<<20, 8<<20
	otherJSON, _ := json.Marshal(other)
	for _, c := range []struct {
		name, path string
		b          []byte
		want       []string
	}{
		{"manifest cut short", mp, man[:len(man)/2], []string{mp, "truncated", "record again"}},
		{"manifest with junk after it", mp, append(slices.Clone(man), "{}"...), []string{mp, "after the manifest", "record again"}},
		{"first file cut short", first, data[:len(data)-5], []string{first, "truncated", "record again"}},
		{"first file without its data", first, data[:12], []string{first, "truncated", "record again"}},
		{"a middle file cut short", middle, data[:len(data)-1], []string{middle, "truncated", "record again"}},
		{"manifest of another model", mp, otherJSON, []string{first, "8388608", "another model"}},
	} {
		orig, _ := os.ReadFile(c.path)
		os.WriteFile(c.path, c.b, 0o644)
		_, err := Open(rec)
		os.WriteFile(c.path, orig, 0o644)
		if err == nil || !errors.Is(err, ErrFormat) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: %v; want one line, ErrFormat", c.name, err)
			continue
		}
		t.Logf("%s: %v", c.name, err)
		for _, s := range c.want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: %v; want it to say %q", c.name, err, s)
			}
		}
	}
	if _, err := Open(filepath.Join(dir, "nope")); err == nil || !strings.Contains(err.Error(), "no such folder") {
		t.Errorf("a missing folder: %v", err)
	}
}

// FuzzParseHeader: no input panics the parser or the decoder, and a header
// it accepts tiles its data exactly.
func FuzzParseHeader(f *testing.F) {
	var buf bytes.Buffer
	WriteFloat32s(&buf, []string{"a", "b"}, [][]int{{2}, {1, 1}}, []float32{1, 2, 3}, map[string]string{"k": "v"})
	f.Add(buf.Bytes())
	f.Add(file(`{"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}`, make([]byte, 4)))
	f.Add(file(`{"w":{"dtype":"F16","shape":[],"data_offsets":[0,2]},"v":{"dtype":"F64","shape":[0],"data_offsets":[2,2]}}`, make([]byte, 2)))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b, int64(len(b)))
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error without ErrFormat: %v", err)
			}
			return
		}
		var end int64
		var params []Param
		off := 0
		for _, tn := range h.Tensors {
			if tn.Begin != end || tn.End-tn.Begin != tn.Len()*int64(tn.DType.Size()) {
				t.Fatalf("accepted tensor %+v after offset %d", tn, end)
			}
			end = tn.End
			if tn.Len() > 1<<20 {
				return
			}
			params = append(params, Param{Tensor: layout.Tensor{Name: tn.Name, Shape: tn.Shape, Offset: off, Size: int(tn.Len())}, DType: tn.DType})
			off += int(tn.Len())
		}
		if h.DataStart+end != int64(len(b)) {
			t.Fatalf("accepted a file of %d bytes whose data ends at %d", len(b), h.DataStart+end)
		}
		if err := DecodeFile(b, params, make([]float32, off), "fuzz"); err != nil {
			t.Fatalf("an accepted header does not decode: %v", err)
		}
	})
}

// FuzzManifest: no input panics the manifest's parser; an error is one
// line wrapping ErrFormat, and a manifest it accepts lays its parameters
// out one after another, N elements in all, and parses again the same
// once written out.
func FuzzManifest(f *testing.F) {
	good, err := json.Marshal(Manifest{Format: FormatName, Version: Version, Files: FilePattern, Model: "m", Workers: 2, Steps: 3, Batch: 4,
		StepsPerEpoch: 10, StepTime: StepTime{Seconds: 0.1, Device: "cpu"},
		Params: []Param{{Tensor: layout.Tensor{Name: "a", Shape: []int{2, 3}, Size: 6}, DType: F32}, {Tensor: layout.Tensor{Name: "b", Shape: []int{}, Offset: 6, Size: 1}, DType: BF16}}, N: 7,
		Run: json.RawMessage(`{"clip":0.4}`)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(`{"format":"sparsegrad-gradients","version":1,"files":"step-%06d/rank-%05d.safetensors","workers":1,"params":[{"name":"x","shape":[0],"size":0,"dtype":"F16"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseManifest(b, "manifest.json")
		if err != nil {
			if !errors.Is(err, ErrFormat) || strings.Contains(err.Error(), "\n") {
				t.Fatalf("error not one line wrapping ErrFormat: %q", err)
			}
			return
		}
		off := 0
		for _, p := range m.Params {
			if p.Offset != off || p.Size < 0 || p.DType.Size() == 0 {
				t.Fatalf("accepted parameter %+v at offset %d", p, off)
			}
			off += p.Size
		}
		if off != m.N || m.Workers < 1 || m.Steps < 0 {
			t.Fatalf("accepted manifest %+v", m)
		}
		again, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := ParseManifest(again, "again")
		if err != nil {
			t.Fatalf("an accepted manifest written out does not parse: %v", err)
		}
		if m2.N != m.N || len(m2.Params) != len(m.Params) || m2.Workers != m.Workers || m2.Steps != m.Steps {
			t.Fatalf("written out and parsed again: %+v, was %+v", m2, m)
		}
	})
}

// TestWrittenHeaderIsJSON: the header WriteFloat32s writes is plain JSON
// that other readers (Python's json, safetensors) parse.
func TestWrittenHeaderIsJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteFloat32s(&buf, []string{`we"ird`, "b"}, [][]int{{2}, {1}}, []float32{1, 2, 3}, nil); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	n := binary.LittleEndian.Uint64(b)
	if (8+n)%8 != 0 {
		t.Errorf("data starts at %d, not aligned to 8", 8+n)
	}
	var m map[string]any
	if err := json.Unmarshal(b[8:8+n], &m); err != nil {
		t.Fatal(err)
	}
	if _, ok := m[`we"ird`]; !ok {
		t.Fatalf("header %s", b[8:8+n])
	}
}
