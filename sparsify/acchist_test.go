package sparsify

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
)

// histOps is the CPU's Ops with the GPU's top-k from an accumulation's
// counts (cuda.Sparse.TopKHist): it fails unless the counts are the plain
// histogram of x's magnitude bits 30..20, then selects as TopK does and
// clears them.
type histOps struct {
	Ops
	used *int
}

func (h histOps) TopKHist(s device.Stream, idx, val, x, hist device.Buffer, k int) (int, error) {
	*h.used++
	want := plainHist(x.Float32s())
	if got := hist.Int32s(); !slices.Equal(got, want) {
		return 0, errCountsDiffer
	}
	clear(hist.Int32s())
	return h.Ops.TopK(s, idx, val, x, k)
}

var errCountsDiffer = errors.New("the counts are not the histogram of x")

// plainHist counts x's magnitudes by bits 30..20.
func plainHist(x []float32) []int32 {
	h := make([]int32, histLen)
	for _, v := range x {
		h[(math.Float32bits(v)&0x7fffffff)>>20]++
	}
	return h
}

// topkFirst is a core that selects acc's top-k first through topKAcc
// (good) or Ops.TopK (a core misdeclaring TopKOfAcc), then keeps
// everything as residual and sends nothing.
type topkFirst struct {
	e    *Env
	good bool
}

func (c topkFirst) Reduce(_ context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	v := &c.e.v
	sel, err := v.scratch(&c.e.dSel, device.Int32, c.e.k)
	if err != nil {
		return err
	}
	if c.good {
		st.Selected, err = c.e.topKAcc(sel, device.Buffer{}, acc, c.e.k)
	} else {
		st.Selected, err = v.ops.TopK(v.s, sel, device.Buffer{}, acc, c.e.k)
	}
	if err != nil {
		return err
	}
	clear(out.Float32s())
	copy(residual.Float32s(), acc.Float32s())
	return nil
}

// TestHistogramContract: a reducer hands out the histogram only to a method
// declaring TopKOfAcc on Ops that can use it (not the CPU's), the call's
// selection consumes the counts, a core that declares TopKOfAcc and does
// not select through topKAcc fails the call, and counts no selection
// consumed (a misdeclared core, a call failing before its selection) are
// cleared before the histogram is handed out again; not during a call.
func TestHistogramContract(t *testing.T) {
	ctx := context.Background()
	l, err := FlatLayout(1000)
	if err != nil {
		t.Fatal(err)
	}
	// The CPU's reducer of a declared method: no histogram.
	cpu, err := New("topk", Options{Density: 0.01, Layout: l, Comm: local.New(1).Comm(0)})
	if err != nil {
		t.Fatal(err)
	}
	if h, err := cpu.Histogram(); err != nil || h.Len() != 0 {
		t.Fatalf("the CPU's topk: Histogram %v, %v; want none", h, err)
	}
	for _, m := range []string{"topk", "topka"} {
		if mm, _ := Lookup(m); !mm.TopKOfAcc {
			t.Fatalf("%s selects the top-k of acc first but does not declare TopKOfAcc", m)
		}
	}
	used := 0
	build := func(declared, good bool) *Reducer {
		e := newEnv(Options{Density: 0.01, Layout: l, Comm: local.New(1).Comm(0), Ops: histOps{CPUOps(), &used}})
		r, err := newReducer(Method{Name: "first", TopKOfAcc: declared}, e, topkFirst{e, good})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	acc, out := make([]float32, l.N), make([]float32, l.N)
	// accumulate is error feedback's pass with the counts (the GPU's
	// AccumulateFlagHist): acc += 1, counted into h.
	accumulate := func(h device.Buffer) {
		for i := range acc {
			acc[i] += float32(i%17) - 8
		}
		if h.Len() > 0 {
			for i, c := range plainHist(acc) {
				h.Int32s()[i] += c
			}
		}
	}
	zero := func(h device.Buffer) bool {
		return !slices.ContainsFunc(h.Int32s(), func(c int32) bool { return c != 0 })
	}

	// Not declared: none.
	if h, err := build(false, true).Histogram(); err != nil || h.Len() != 0 {
		t.Fatalf("undeclared: Histogram %v, %v; want none", h, err)
	}
	// Declared and consumed, call after call.
	r := build(true, true)
	for c := range 3 {
		h, err := r.Histogram()
		if err != nil || h.Len() != histLen || !zero(h) {
			t.Fatalf("call %d: Histogram of %d counters (zero: %v), %v", c, h.Len(), h.Len() > 0 && zero(h), err)
		}
		accumulate(h)
		if _, err := r.Reduce(ctx, acc, out, acc); err != nil {
			t.Fatalf("call %d: %v", c, err)
		}
		if used != c+1 || !zero(h) {
			t.Fatalf("call %d: the selection used the counts %d times (want %d), zero after: %v", c, used, c+1, zero(h))
		}
	}
	// Without a histogram asked for, the plain selection.
	accumulate(device.Buffer{})
	if _, err := r.Reduce(ctx, acc, out, acc); err != nil || used != 3 {
		t.Fatalf("a call without counts: %v, counts used %d times (want 3)", err, used)
	}
	// A call failing before its selection leaves its counts; the next
	// Histogram clears them.
	h, _ := r.Histogram()
	accumulate(h)
	if _, err := r.Reduce(ctx, acc, out[:10], acc); err == nil {
		t.Fatal("a call with a short out succeeded")
	}
	if zero(h) {
		t.Fatal("the failed call's counts vanished: the test proves nothing")
	}
	if h, _ = r.Histogram(); !zero(h) {
		t.Fatal("Histogram after a failed call handed out counts no selection consumed")
	}
	// Not during a call.
	accumulate(h)
	if err := r.StartGroups(ctx, []int{0}, device.Host(acc), device.Host(out), device.Host(acc)); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Histogram(); err == nil || !strings.Contains(err.Error(), "during a call") {
		t.Fatalf("Histogram during a call: %v", err)
	}
	if _, err := r.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	// Misdeclared: the call fails, naming TopKOfAcc, and the counts are
	// cleared before they are handed out again.
	bad := build(true, false)
	h, _ = bad.Histogram()
	accumulate(h)
	if _, err := bad.Reduce(ctx, acc, out, acc); err == nil || !strings.Contains(err.Error(), "TopKOfAcc") {
		t.Fatalf("a core declaring TopKOfAcc that selects otherwise: %v", err)
	}
	if h, _ = bad.Histogram(); !zero(h) {
		t.Fatal("Histogram after a misdeclared call handed out its counts")
	}
}
