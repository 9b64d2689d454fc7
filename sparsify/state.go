package sparsify

import (
	"encoding/binary"
	"fmt"
	"math"
)

// The state of a reducer (Reducer.State) is the method's name and the
// format version, written by the frame, then the values the core writes
// (Stateful), little-endian.

// stateVersion is the format of every method's state; a change of what a
// method keeps increments it.
const stateVersion = 1

// StateWriter encodes a core's state (Stateful.SaveState).
type StateWriter struct{ b []byte }

func newStateWriter(method string) *StateWriter {
	w := &StateWriter{}
	w.b = append(w.b, byte(len(method)))
	w.b = append(w.b, method...)
	w.b = append(w.b, stateVersion)
	return w
}

// Int writes an int (8 bytes).
func (w *StateWriter) Int(v int) { w.b = binary.LittleEndian.AppendUint64(w.b, uint64(int64(v))) }

// Float writes a float64 (8 bytes).
func (w *StateWriter) Float(v float64) {
	w.b = binary.LittleEndian.AppendUint64(w.b, math.Float64bits(v))
}

// Bool writes a bool (1 byte).
func (w *StateWriter) Bool(v bool) {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}

// Float32s writes a length and the float32s.
func (w *StateWriter) Float32s(v []float32) {
	w.Int(len(v))
	for _, x := range v {
		w.b = binary.LittleEndian.AppendUint32(w.b, math.Float32bits(x))
	}
}

// Ints writes a length and the ints.
func (w *StateWriter) Ints(v []int) {
	w.Int(len(v))
	for _, x := range v {
		w.Int(x)
	}
}

// StateReader decodes a core's state (Stateful.LoadState); the first
// problem is kept, every later read returns zero, and Done returns it.
type StateReader struct {
	b      []byte
	method string
	err    error
}

func newStateReader(b []byte, method string) *StateReader {
	r := &StateReader{b: b, method: method}
	if len(b) == 0 {
		r.err = fmt.Errorf("sparsify: %s: empty state (a checkpoint of a method that keeps none?)", method)
		return r
	}
	n := int(b[0])
	if len(b) < 2+n {
		r.err = fmt.Errorf("sparsify: %s: state of %d bytes is truncated", method, len(b))
		return r
	}
	if got := string(b[1 : 1+n]); got != method {
		r.err = fmt.Errorf("sparsify: %s: the state is of method %q (a checkpoint of another -sparsifier)", method, got)
		return r
	}
	if v := b[1+n]; v != stateVersion {
		r.err = fmt.Errorf("sparsify: %s: state format %d, this build reads %d", method, v, stateVersion)
		return r
	}
	r.b = b[2+n:]
	return r
}

func (r *StateReader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("state: "+format, a...)
	}
}

func (r *StateReader) u64(what string) uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 8 {
		r.fail("truncated in %s", what)
		return 0
	}
	v := binary.LittleEndian.Uint64(r.b)
	r.b = r.b[8:]
	return v
}

// Int reads an int in [lo, hi] (what names it in an error).
func (r *StateReader) Int(what string, lo, hi int) int {
	v := int64(r.u64(what))
	if r.err == nil && (v < int64(lo) || v > int64(hi)) {
		r.fail("%s %d is outside [%d, %d]", what, v, lo, hi)
		return 0
	}
	return int(v)
}

// Float reads a finite float64 (NaN and ±Inf are refused).
func (r *StateReader) Float(what string) float64 {
	v := math.Float64frombits(r.u64(what))
	if r.err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
		r.fail("%s is %v", what, v)
		return 0
	}
	return v
}

// Bool reads a bool.
func (r *StateReader) Bool(what string) bool {
	if r.err != nil {
		return false
	}
	if len(r.b) < 1 || r.b[0] > 1 {
		r.fail("truncated or invalid in %s", what)
		return false
	}
	v := r.b[0] == 1
	r.b = r.b[1:]
	return v
}

// Ints reads want ints (a length prefix that must equal want), each in
// [lo, hi].
func (r *StateReader) Ints(what string, want, lo, hi int) []int {
	n := r.Int(what+" length", want, want)
	if r.err != nil {
		return nil
	}
	v := make([]int, n)
	for i := range v {
		v[i] = r.Int(what, lo, hi)
	}
	return v
}

// Float32s reads want float32 (a length prefix that must equal want), each
// finite.
func (r *StateReader) Float32s(what string, want int) []float32 {
	n := r.Int(what+" length", want, want)
	if r.err != nil {
		return nil
	}
	if len(r.b) < 4*n {
		r.fail("truncated in %s", what)
		return nil
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(r.b[4*i:]))
		if math.IsNaN(float64(v[i])) || math.IsInf(float64(v[i]), 0) {
			r.fail("%s element %d is %v", what, i, v[i])
			return nil
		}
	}
	r.b = r.b[4*n:]
	return v
}

// Done returns the first problem, or an error for bytes left over.
func (r *StateReader) Done() error {
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes left over (a state of another format?)", len(r.b))
	}
	return r.err
}

// maxCount bounds a state's call counts.
const maxCount = math.MaxInt64
