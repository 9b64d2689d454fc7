package recorded

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// The safetensors format (https://github.com/huggingface/safetensors): an
// 8-byte little-endian header length n, n bytes of a JSON object, then the
// data. The object maps each tensor's name to its dtype ("F32", "F16",
// "BF16", ...), shape and data_offsets [begin, end) relative to the start of
// the data; an optional "__metadata__" maps strings to strings. The
// tensors' bytes are little-endian, row-major, cover the data without holes
// or overlaps, and the header may be padded with spaces.
//
// This package reads the format itself rather than through a Go module:
// the one maintained reader (github.com/nlpodyssey/safetensors, untagged)
// hands 16-bit floats back as its own types, so the conversion to float32
// would be ours anyway, and a gradient is read straight into its place in
// the flat vector without an intermediate tensor.

// ErrFormat is wrapped by every error about a malformed safetensors file or
// recording.
var ErrFormat = errors.New("recorded: not a valid recording")

// maxHeader bounds the JSON header (the reference implementation refuses
// headers above 100 MB).
const maxHeader = 100 << 20

// DType is a safetensors element type this package reads.
type DType string

// The element types a recorded gradient may have: PyTorch's float32,
// float16 and bfloat16 (and float64), converted to float32 when read.
const (
	F32  DType = "F32"
	F16  DType = "F16"
	BF16 DType = "BF16"
	F64  DType = "F64"
)

// Size is the size of one element in bytes (0 for a type this package does
// not read).
func (d DType) Size() int {
	switch d {
	case F32:
		return 4
	case F16, BF16:
		return 2
	case F64:
		return 8
	}
	return 0
}

// otherDTypes are the safetensors types a file may hold that are not
// gradients (named in errors).
var otherDTypes = map[string]int{"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "I32": 4, "U32": 4, "I64": 8, "U64": 8}

// Tensor is one tensor of a safetensors header.
type Tensor struct {
	Name  string
	DType DType
	Shape []int
	// Begin and End are its bytes, relative to the start of the data.
	Begin, End int64
}

// Len is the number of elements (1 for a scalar).
func (t Tensor) Len() int64 {
	n := int64(1)
	for _, d := range t.Shape {
		n *= int64(d)
	}
	return n
}

// Header is a parsed safetensors header.
type Header struct {
	// Tensors are in the order of their data.
	Tensors []Tensor
	// Metadata is the "__metadata__" object (nil if absent).
	Metadata map[string]string
	// DataStart is the file offset of the data (8 + the header length).
	DataStart int64
	// DataLen is the length of the data the tensors cover.
	DataLen int64
}

// Lookup returns the tensor of that name.
func (h *Header) Lookup(name string) (Tensor, bool) {
	for _, t := range h.Tensors {
		if t.Name == name {
			return t, true
		}
	}
	return Tensor{}, false
}

// ParseHeader parses the header at the start of b, which holds at least the
// 8-byte length and the JSON header (the data may follow). It checks
// everything the header says: known types, shapes that match the byte
// ranges, ranges that tile the data from 0 without holes or overlaps. size
// is the file's size (the data must fit it), or -1 when unknown.
func ParseHeader(b []byte, size int64) (*Header, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: safetensors: %s", ErrFormat, fmt.Sprintf(format, a...))
	}
	if len(b) < 8 {
		return nil, bad("%d bytes: shorter than the 8-byte header length", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > maxHeader {
		return nil, bad("header of %d bytes: more than the format's %d (not a safetensors file?)", n, maxHeader)
	}
	if uint64(len(b)-8) < n {
		return nil, bad("header of %d bytes, but only %d follow (truncated)", n, len(b)-8)
	}
	js := b[8 : 8+n]
	if len(js) == 0 || js[0] != '{' {
		return nil, bad("the header does not start with '{' (not a safetensors file?)")
	}
	h := &Header{DataStart: 8 + int64(n)}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.UseNumber()
	if _, err := dec.Token(); err != nil {
		return nil, bad("header: %v", err)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, bad("header: %v", err)
		}
		name, _ := tok.(string)
		if seen[name] {
			return nil, bad("tensor %q appears twice in the header", name)
		}
		seen[name] = true
		if name == "__metadata__" {
			if err := dec.Decode(&h.Metadata); err != nil {
				return nil, bad("__metadata__ is not an object of strings: %v", err)
			}
			continue
		}
		var raw struct {
			DType       string         `json:"dtype"`
			Shape       []json.Number  `json:"shape"`
			DataOffsets [2]json.Number `json:"data_offsets"`
		}
		if err := dec.Decode(&raw); err != nil {
			return nil, bad("tensor %q: %v", name, err)
		}
		t := Tensor{Name: name, DType: DType(raw.DType)}
		es := t.DType.Size()
		if es == 0 {
			if _, ok := otherDTypes[raw.DType]; ok {
				return nil, bad("tensor %q is of type %s; gradients are F32, F16, BF16 or F64", name, raw.DType)
			}
			return nil, bad("tensor %q has unknown dtype %q", name, raw.DType)
		}
		elems := int64(1)
		for _, d := range raw.Shape {
			v, err := strconv.ParseInt(d.String(), 10, 64)
			if err != nil || v < 0 || v > math.MaxInt32 {
				return nil, bad("tensor %q has shape %v: each dimension must be a whole number in [0, 2^31)", name, raw.Shape)
			}
			t.Shape = append(t.Shape, int(v))
			if elems != 0 && v > (math.MaxInt64/8)/elems {
				return nil, bad("tensor %q of shape %v is too large", name, raw.Shape)
			}
			elems *= v
		}
		for i, o := range raw.DataOffsets {
			v, err := strconv.ParseInt(o.String(), 10, 64)
			if err != nil || v < 0 {
				return nil, bad("tensor %q has data_offsets %v: want two non-negative whole numbers", name, raw.DataOffsets)
			}
			if i == 0 {
				t.Begin = v
			} else {
				t.End = v
			}
		}
		if t.End < t.Begin {
			return nil, bad("tensor %q ends (%d) before it begins (%d)", name, t.End, t.Begin)
		}
		if want := elems * int64(es); t.End-t.Begin != want {
			return nil, bad("tensor %q of shape %v and type %s needs %d bytes, its data_offsets give %d", name, t.Shape, t.DType, want, t.End-t.Begin)
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil {
		return nil, bad("header: %v", err)
	}
	if rest := strings.TrimRight(string(js[dec.InputOffset():]), " "); rest != "" {
		return nil, bad("the header has %d bytes after its JSON object that are not padding", len(rest))
	}
	slices.SortStableFunc(h.Tensors, func(a, b Tensor) int {
		return cmp.Or(cmp.Compare(a.Begin, b.Begin), cmp.Compare(a.End, b.End))
	})
	var end int64
	for _, t := range h.Tensors {
		if t.Begin != end {
			if t.Begin < end {
				return nil, bad("tensor %q overlaps the tensor before it (bytes %d-%d, the previous ends at %d)", t.Name, t.Begin, t.End, end)
			}
			return nil, bad("a hole in the data before tensor %q (bytes %d-%d follow the previous tensor's end at %d)", t.Name, t.Begin, t.End, end)
		}
		end = t.End
	}
	h.DataLen = end
	if size >= 0 && h.DataStart+end != size {
		if h.DataStart+end > size {
			return nil, bad("the tensors need %d bytes of data, the file has %d (truncated)", end, size-h.DataStart)
		}
		return nil, bad("%d bytes after the last tensor's data", size-h.DataStart-end)
	}
	return h, nil
}

// Decode converts the little-endian elements of type dt in src into dst
// (len(dst) elements; src holds len(dst)·dt.Size() bytes). float16 and
// bfloat16 convert exactly; float64 rounds to the nearest float32.
func Decode(dst []float32, src []byte, dt DType) error {
	if len(src) != len(dst)*dt.Size() || dt.Size() == 0 {
		return fmt.Errorf("%w: %d bytes of %s for %d elements", ErrFormat, len(src), dt, len(dst))
	}
	switch dt {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case BF16:
		for i := range dst {
			dst[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(src[2*i:])) << 16)
		}
	case F16:
		for i := range dst {
			dst[i] = HalfToFloat32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case F64:
		for i := range dst {
			dst[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(src[8*i:])))
		}
	}
	return nil
}

// HalfToFloat32 converts an IEEE 754 binary16 value (its bits) to float32,
// exactly: subnormals, infinities and NaNs (with their payload) included.
func HalfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	man := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f: // Inf or NaN
		return math.Float32frombits(sign | 0xff<<23 | man<<13)
	case exp != 0: // normal: rebias 15 -> 127
		return math.Float32frombits(sign | (exp+112)<<23 | man<<13)
	case man == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: man·2^-24, normalised for float32.
	e := uint32(113)
	for man&0x400 == 0 {
		man <<= 1
		e--
	}
	return math.Float32frombits(sign | e<<23 | (man&0x3ff)<<13)
}

// WriteFloat32s writes a safetensors file of float32 tensors to w: one
// tensor per name, in the given order, each with its shape and its values
// (the tensors' values one after the other in data, in the same order).
// metadata may be nil.
func WriteFloat32s(w io.Writer, names []string, shapes [][]int, data []float32, metadata map[string]string) error {
	var hdr bytes.Buffer
	hdr.WriteByte('{')
	if len(metadata) > 0 {
		mb, err := json.Marshal(metadata)
		if err != nil {
			return err
		}
		hdr.WriteString(`"__metadata__":`)
		hdr.Write(mb)
	}
	var off int64
	for i, name := range names {
		n := int64(1)
		for _, d := range shapes[i] {
			n *= int64(d)
		}
		nb, _ := json.Marshal(name)
		sb, _ := json.Marshal(shapes[i])
		if shapes[i] == nil {
			sb = []byte("[]")
		}
		if hdr.Len() > 1 {
			hdr.WriteByte(',')
		}
		fmt.Fprintf(&hdr, `%s:{"dtype":"F32","shape":%s,"data_offsets":[%d,%d]}`, nb, sb, off, off+4*n)
		off += 4 * n
	}
	hdr.WriteByte('}')
	if off != 4*int64(len(data)) {
		return fmt.Errorf("recorded: the shapes hold %d elements, the data %d", off/4, len(data))
	}
	// Pad the header to a multiple of 8 bytes, so that the data is aligned.
	for (8+hdr.Len())%8 != 0 {
		hdr.WriteByte(' ')
	}
	var lenb [8]byte
	binary.LittleEndian.PutUint64(lenb[:], uint64(hdr.Len()))
	if _, err := w.Write(lenb[:]); err != nil {
		return err
	}
	if _, err := w.Write(hdr.Bytes()); err != nil {
		return err
	}
	buf := make([]byte, 0, 1<<16)
	for len(data) > 0 {
		k := min(len(data), cap(buf)/4)
		buf = buf[:4*k]
		for i, x := range data[:k] {
			binary.LittleEndian.PutUint32(buf[4*i:], math.Float32bits(x))
		}
		if _, err := w.Write(buf); err != nil {
			return err
		}
		data = data[k:]
	}
	return nil
}
