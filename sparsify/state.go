package sparsify

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/sparsegrad/sparsegrad/device"
)

// Stateful is implemented by the reducers whose output depends on the calls
// before it: counters that seed random draws or rotate a leader, thresholds
// that adapt from call to call, dense warm-ups, re-balanced regions, LAGS'
// backward times and network model. A checkpoint saves State on every rank;
// a resumed run builds the reducer again with the same Options and the same
// rank and calls SetState before its first Reduce, after which the reducer
// continues exactly as the saved one would have (bit for bit).
//
// The reducers not listed below (dense, topk, topka, gtopk, threshold) keep
// nothing from one call to the next; SaveState returns nil for them.
//
// What each method keeps: randomk the call count (it seeds its draws); dgc
// the call count and, with momentum correction, its velocity; dragonn the
// call count (warm-up, sampling seeds) and the hash counter; cltk and deft the call count (the rotating leader); micro the
// call count, the threshold and the last global count; oktopk the call count
// (warm-up, recompute schedule), its local and global thresholds and region
// boundaries; topkdsa the call count (warm-up); spardl the B-SAG budget h,
// its step and inertia; lags the backward times and the network model of its
// adaptive density.
type Stateful interface {
	Reducer
	// State encodes the state carried from one call to the next (the
	// method's name, a format version and its values).
	State() []byte
	// SetState restores what State returned on the same rank of a reducer
	// built with the same Options. A state of another method, of another
	// format or with impossible values is an error, and the reducer is
	// unchanged. It must not be called while a call is in flight.
	SetState(b []byte) error
}

// SaveState returns r's state (Stateful.State), or nil when r keeps none.
// A state held partly in device memory (dgc's velocity) is read back, which
// can fail.
func SaveState(r Reducer) ([]byte, error) {
	if s, ok := r.(interface{ StateOn() ([]byte, error) }); ok {
		return s.StateOn()
	}
	if s, ok := r.(Stateful); ok {
		return s.State(), nil
	}
	return nil, nil
}

// RestoreState gives r the state SaveState returned. A reducer that keeps no
// state accepts only an empty one.
func RestoreState(r Reducer, b []byte) error {
	if s, ok := r.(Stateful); ok {
		return s.SetState(b)
	}
	if len(b) > 0 {
		return fmt.Errorf("sparsify: %s keeps no state between calls, but a state of %d bytes was given (a checkpoint of another method?)", r.Name(), len(b))
	}
	return nil
}

// stateVersion is the format of every method's state; a change of what a
// method keeps increments it.
const stateVersion = 1

// stateWriter encodes a state: the method name and the format version, then
// the values, little-endian.
type stateWriter struct{ b []byte }

func newStateWriter(method string) *stateWriter {
	w := &stateWriter{}
	w.b = append(w.b, byte(len(method)))
	w.b = append(w.b, method...)
	w.b = append(w.b, stateVersion)
	return w
}

func (w *stateWriter) int(v int) { w.b = binary.LittleEndian.AppendUint64(w.b, uint64(int64(v))) }
func (w *stateWriter) float(v float64) {
	w.b = binary.LittleEndian.AppendUint64(w.b, math.Float64bits(v))
}
func (w *stateWriter) bool(v bool) {
	if v {
		w.b = append(w.b, 1)
	} else {
		w.b = append(w.b, 0)
	}
}
func (w *stateWriter) float32s(v []float32) {
	w.int(len(v))
	for _, x := range v {
		w.b = binary.LittleEndian.AppendUint32(w.b, math.Float32bits(x))
	}
}
func (w *stateWriter) ints(v []int) {
	w.int(len(v))
	for _, x := range v {
		w.int(x)
	}
}

// stateReader decodes a state; the first problem is kept in err and every
// later read returns zero.
type stateReader struct {
	b      []byte
	method string
	err    error
}

func newStateReader(b []byte, method string) *stateReader {
	r := &stateReader{b: b, method: method}
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

func (r *stateReader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("sparsify: %s: state: "+format, append([]any{r.method}, a...)...)
	}
}

func (r *stateReader) u64(what string) uint64 {
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

// int reads an int in [lo, hi].
func (r *stateReader) int(what string, lo, hi int) int {
	v := int64(r.u64(what))
	if r.err == nil && (v < int64(lo) || v > int64(hi)) {
		r.fail("%s %d is outside [%d, %d]", what, v, lo, hi)
		return 0
	}
	return int(v)
}

// float reads a finite float64 (NaN and ±Inf are refused).
func (r *stateReader) float(what string) float64 {
	v := math.Float64frombits(r.u64(what))
	if r.err == nil && (math.IsNaN(v) || math.IsInf(v, 0)) {
		r.fail("%s is %v", what, v)
		return 0
	}
	return v
}

func (r *stateReader) bool(what string) bool {
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

// ints reads want ints (a length prefix that must equal want), each in
// [lo, hi].
func (r *stateReader) ints(what string, want, lo, hi int) []int {
	n := r.int(what+" length", want, want)
	if r.err != nil {
		return nil
	}
	v := make([]int, n)
	for i := range v {
		v[i] = r.int(what, lo, hi)
	}
	return v
}

// float32s reads want float32 (a length prefix that must equal want), each
// finite.
func (r *stateReader) float32s(what string, want int) []float32 {
	n := r.int(what+" length", want, want)
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

// done returns the first problem, or an error for bytes left over.
func (r *stateReader) done() error {
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes left over (a state of another format?)", len(r.b))
	}
	return r.err
}

const maxCount = math.MaxInt64

// randomk: the call count seeds the index draw.

func (r *randomkReducer) State() []byte {
	w := newStateWriter("randomk")
	w.int(r.base.iter)
	return w.b
}

func (r *randomkReducer) SetState(b []byte) error {
	d := newStateReader(b, "randomk")
	it := d.int("call count", 0, maxCount)
	if err := d.done(); err != nil {
		return err
	}
	r.base.iter = it
	return nil
}

// dgc: the call count (it seeds the samples' random start and counts the
// warm-up's epochs) and, with momentum correction, the masked velocity of
// the compressed tensors and the momentum of the dense ones (N float32,
// read from the device: StateOn).

func (r *dgcReducer) State() []byte {
	b, err := r.StateOn()
	if err != nil {
		// Only a device copy can fail; SaveState reports it (the trainer
		// calls that).
		panic(err)
	}
	return b
}

// StateOn is State for a reducer whose velocity may live in device memory:
// reading it back can fail.
func (r *dgcReducer) StateOn() ([]byte, error) {
	w := newStateWriter("dgc")
	w.int(r.base.iter)
	w.bool(r.hasVel)
	if r.hasVel {
		v := &r.base.v
		vel := make([]float32, r.vel.Len())
		if err := v.s.Copy(device.Host(vel), r.vel); err != nil {
			return nil, fmt.Errorf("sparsify: dgc: reading the velocity back for the state: %w", err)
		}
		if err := v.s.Synchronize(); err != nil {
			return nil, fmt.Errorf("sparsify: dgc: reading the velocity back for the state: %w", err)
		}
		w.float32s(vel)
	}
	return w.b, nil
}

func (r *dgcReducer) SetState(b []byte) error {
	d := newStateReader(b, "dgc")
	it := d.int("call count", 0, maxCount)
	has := d.bool("velocity present")
	var vel []float32
	if has {
		vel = d.float32s("velocity", r.base.n)
	}
	if err := d.done(); err != nil {
		return err
	}
	if has && r.momentum == 0 {
		return errors.New("sparsify: dgc: the state holds a momentum-corrected velocity, but this reducer has no momentum (Options.Momentum differs from the saved run's)")
	}
	if !has && r.momentum > 0 && it > 0 {
		return errors.New("sparsify: dgc: the state has no velocity, but this reducer corrects momentum (Options.Momentum differs from the saved run's)")
	}
	if has {
		v := &r.base.v
		var err error
		if r.vel, err = v.scratch(&r.vel, device.Float32, r.base.n); err != nil {
			return err
		}
		if err := v.s.Copy(r.vel, device.Host(vel)); err != nil {
			return err
		}
		if err := v.s.Synchronize(); err != nil {
			return err
		}
		r.hasVel = true
	}
	r.base.iter = it
	return nil
}

// dragonn: the call count (dense warm-up, sampling seeds) and the hash
// counter.

func (r *dragonnReducer) State() []byte {
	w := newStateWriter("dragonn")
	w.int(r.base.iter)
	w.int(r.calls)
	return w.b
}

func (r *dragonnReducer) SetState(b []byte) error {
	d := newStateReader(b, "dragonn")
	it := d.int("call count", 0, maxCount)
	calls := d.int("hash counter", 0, dragonnSeedWrap-1)
	if err := d.done(); err != nil {
		return err
	}
	r.base.iter, r.calls = it, calls
	return nil
}

// cltk: the call count rotates the leader.

func (r *cltkReducer) State() []byte {
	w := newStateWriter("cltk")
	w.int(r.t)
	return w.b
}

func (r *cltkReducer) SetState(b []byte) error {
	d := newStateReader(b, "cltk")
	t := d.int("call count", 0, maxCount)
	if err := d.done(); err != nil {
		return err
	}
	r.t = t
	return nil
}

// deft: the call count rotates the leader that packs the bins.

func (d *deftReducer) State() []byte {
	w := newStateWriter("deft")
	w.int(d.t)
	return w.b
}

func (d *deftReducer) SetState(b []byte) error {
	r := newStateReader(b, "deft")
	t := r.int("call count", 0, maxCount)
	if err := r.done(); err != nil {
		return err
	}
	d.t = t
	return nil
}

// micro: the call count (rotating partitions), the threshold and the last
// global count its controller adapts from.

func (m *microReducer) State() []byte {
	w := newStateWriter("micro")
	w.int(m.t)
	w.float(m.thr)
	w.int(m.kPrev)
	return w.b
}

func (m *microReducer) SetState(b []byte) error {
	d := newStateReader(b, "micro")
	t := d.int("call count", 0, maxCount)
	thr := d.float("threshold")
	kPrev := d.int("last global count", 0, m.o.Layout.N)
	if err := d.done(); err != nil {
		return err
	}
	m.t, m.thr, m.kPrev = t, thr, kPrev
	return nil
}

// oktopk: the call count (warm-up and the recompute schedule), the local and
// global thresholds and the region boundaries.

func (r *okTopkReducer) State() []byte {
	w := newStateWriter("oktopk")
	w.int(r.base.iter)
	w.float(r.lthr)
	w.float(r.gthr)
	w.ints(r.reg.offs)
	return w.b
}

func (r *okTopkReducer) SetState(b []byte) error {
	d := newStateReader(b, "oktopk")
	it := d.int("call count", 0, maxCount)
	lthr := d.float("local threshold")
	gthr := d.float("global threshold")
	offs := d.ints("region boundaries", len(r.reg.offs), 0, r.reg.n)
	if err := d.done(); err != nil {
		return err
	}
	if offs[0] != 0 || offs[len(offs)-1] != r.reg.n {
		return fmt.Errorf("sparsify: oktopk: state: regions span [%d, %d), not the %d elements", offs[0], offs[len(offs)-1], r.reg.n)
	}
	for i := 1; i < len(offs); i++ {
		if offs[i] < offs[i-1] {
			return fmt.Errorf("sparsify: oktopk: state: region boundary %d (%d) is below the one before it (%d)", i, offs[i], offs[i-1])
		}
	}
	r.base.iter, r.lthr, r.gthr = it, lthr, gthr
	copy(r.reg.offs, offs)
	return nil
}

// topkdsa: the call count (dense warm-up).

func (r *topkDSAReducer) State() []byte {
	w := newStateWriter("topkdsa")
	w.int(r.base.iter)
	return w.b
}

func (r *topkDSAReducer) SetState(b []byte) error {
	d := newStateReader(b, "topkdsa")
	it := d.int("call count", 0, maxCount)
	if err := d.done(); err != nil {
		return err
	}
	r.base.iter = it
	return nil
}

// spardl: B-SAG's adaptive per-team budget h, its step and inertia.

func (s *spardlReducer) State() []byte {
	w := newStateWriter("spardl")
	w.int(s.h)
	w.int(s.hStep)
	w.bool(s.hInertia)
	return w.b
}

func (s *spardlReducer) SetState(b []byte) error {
	d := newStateReader(b, "spardl")
	h := d.int("budget h", 1, max(1, s.C))
	step := d.int("budget step", math.MinInt64, math.MaxInt64)
	inertia := d.bool("budget inertia")
	if err := d.done(); err != nil {
		return err
	}
	s.h, s.hStep, s.hInertia = h, step, inertia
	return nil
}

// lags: the backward times and the network model of the adaptive density
// (measured ones cannot be measured again identically); the per-group k
// follow from them.

func (l *LAGS) State() []byte {
	w := newStateWriter("lags")
	w.bool(l.backward != nil)
	for _, d := range l.backward {
		w.int(int(d))
	}
	w.bool(l.haveModel)
	w.float(l.model.Alpha)
	w.float(l.model.Beta)
	w.float(l.model.SparPerElement)
	return w.b
}

func (l *LAGS) SetState(b []byte) error {
	d := newStateReader(b, "lags")
	var backward []time.Duration
	if d.bool("backward times present") {
		backward = make([]time.Duration, len(l.layout.Tensors))
		for i := range backward {
			backward[i] = time.Duration(d.int("backward time", 0, math.MaxInt64))
		}
	}
	have := d.bool("model present")
	m := LAGSModel{Alpha: d.float("latency"), Beta: d.float("byte time"), SparPerElement: d.float("sparsification cost")}
	if err := d.done(); err != nil {
		return err
	}
	if m.Alpha < 0 || m.Beta < 0 || m.SparPerElement < 0 {
		return errors.New("sparsify: lags: state: a negative network model parameter")
	}
	for _, p := range l.pending {
		if p {
			return errors.New("sparsify: lags: SetState while groups are in flight")
		}
	}
	l.backward, l.haveModel, l.model = backward, have, m
	l.recomputeK()
	return nil
}

var (
	_ Stateful = (*randomkReducer)(nil)
	_ Stateful = (*dgcReducer)(nil)
	_ Stateful = (*dragonnReducer)(nil)
	_ Stateful = (*cltkReducer)(nil)
	_ Stateful = (*deftReducer)(nil)
	_ Stateful = (*microReducer)(nil)
	_ Stateful = (*okTopkReducer)(nil)
	_ Stateful = (*topkDSAReducer)(nil)
	_ Stateful = (*spardlReducer)(nil)
	_ Stateful = (*LAGS)(nil)
)
