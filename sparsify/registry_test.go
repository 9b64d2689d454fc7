package sparsify

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

func TestRegistryHasBaselines(t *testing.T) {
	names := strings.Join(Names(), ",")
	for _, m := range []string{"dense", "topk", "topka", "gtopk", "cltk", "threshold"} {
		if !strings.Contains(","+names+",", ","+m+",") {
			t.Errorf("method %q not registered (have %s)", m, names)
		}
	}
	ns := Names()
	for i := 1; i < len(ns); i++ {
		if ns[i-1] >= ns[i] {
			t.Fatalf("Names() not sorted: %v", ns)
		}
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("registering \"topk\" again did not panic")
		}
	}()
	Register(Method{Name: "topk", New: newTopk})
}

func TestNewErrors(t *testing.T) {
	good, _ := FlatLayout(10)
	c := blSingleComm(t)
	cases := []struct {
		name   string
		method string
		o      Options
		want   []string // substrings of the error
	}{
		{"unknown method", "nope", Options{Density: 0.1, Layout: good, Comm: c}, []string{"unknown method", `"nope"`, "topk", "dense", "threshold"}},
		{"no communicator", "topk", Options{Density: 0.1, Layout: good}, []string{"communicator"}},
		{"density 0", "topk", Options{Density: 0, Layout: good, Comm: c}, []string{"density 0", "(0, 1]"}},
		{"density negative", "topka", Options{Density: -0.5, Layout: good, Comm: c}, []string{"density", "(0, 1]"}},
		{"density above 1", "cltk", Options{Density: 1.5, Layout: good, Comm: c}, []string{"density 1.5", "(0, 1]"}},
		{"density NaN", "dense", Options{Density: math.NaN(), Layout: good, Comm: c}, []string{"density NaN"}},
		{"density Inf", "gtopk", Options{Density: math.Inf(1), Layout: good, Comm: c}, []string{"density +Inf"}},
		{"empty layout", "topk", Options{Density: 0.1, Comm: c}, []string{"empty layout", "NewLayout"}},
		{"zero-size tensor", "threshold", Options{Density: 0.1, Comm: c, Layout: Layout{N: 3, Tensors: []Tensor{{Name: "a", Size: 3, Offset: 0}, {Name: "b", Size: 0, Offset: 3}}}}, []string{`"b"`, "size 0"}},
		{"gtopk on 3 workers", "gtopk", Options{Density: 0.1, Layout: good, Comm: local.New(3).Comm(0)}, []string{"3 workers", "power-of-two", "2 or 4"}},
		{"threshold lambda", "threshold", Options{Density: 0.1, Layout: good, Comm: c, Params: Values{"lambda": -1.0}}, []string{"-lambda -1 must be in [0, "}},
		// Regression: a positive λ that rounds to 0 as a float32 selected
		// every element (|acc| >= 0) instead of being refused.
		{"threshold lambda underflows float32", "threshold", Options{Density: 0.1, Layout: good, Comm: c, Params: Values{"lambda": 1e-50}}, []string{"lambda 1e-50", "float32"}},
		// Regression: hand-built layouts whose offsets or N disagree with
		// the tensor sizes were accepted and made Reduce index out of range.
		{"offset gap", "topk", Options{Density: 0.1, Comm: c, Layout: Layout{N: 5, Tensors: []Tensor{{Name: "a", Size: 2, Offset: 0}, {Name: "b", Size: 3, Offset: 3}}}}, []string{`"b"`, "starts at element 3", "end at 2", "NewLayout"}},
		{"N too small", "dgc", Options{Density: 0.1, Comm: c, Layout: Layout{N: 4, Tensors: []Tensor{{Name: "a", Size: 2, Offset: 0}, {Name: "b", Size: 3, Offset: 2}}}}, []string{"5 elements", "N is 4", "NewLayout"}},
		{"N too large", "deft", Options{Density: 0.1, Comm: c, Layout: Layout{N: 9, Tensors: []Tensor{{Name: "a", Size: 2, Offset: 0}, {Name: "b", Size: 3, Offset: 2}}}}, []string{"5 elements", "N is 9"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := New(tc.method, tc.o)
			if err == nil {
				t.Fatalf("New succeeded with %s (%T)", tc.name, r)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if tc.method == "nope" && !errors.Is(err, ErrUnknownMethod) {
				t.Errorf("error %v does not wrap ErrUnknownMethod", err)
			}
		})
	}
}

// TestTinyDensityClampsToOne: a density that rounds k to 0 selects one
// element per worker (BudgetK's documented clamp), for every baseline.
func TestTinyDensityClampsToOne(t *testing.T) {
	for _, m := range []string{"topk", "topka", "gtopk", "cltk"} {
		res := mustRunHarness(t, harnessConfig{Method: m, Workers: 2, N: 1000, Density: 1e-12, Seed: 1})
		for w, st := range res.Stats[0] {
			if st.Selected != 1 {
				t.Fatalf("%s rank %d: Selected = %d at density 1e-12, want 1", m, w, st.Selected)
			}
		}
	}
}

// TestEveryMethodFailsFast: for every registered method, when one worker
// fails, the others' Reduce returns an error instead of waiting forever; a
// cancelled context is an error wrapping context.Canceled.
func TestEveryMethodFailsFast(t *testing.T) {
	boom := errors.New("rank 1 gave up")
	for _, m := range Names() {
		t.Run(m, func(t *testing.T) {
			l, _ := FlatLayout(100)
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			start := time.Now()
			var abortedSeen atomic.Int32
			err := local.Run(ctx, 4, func(ctx context.Context, c comm.Communicator) error {
				r, err := New(m, Options{Density: 0.1, Layout: l, Comm: c})
				if err != nil {
					return err
				}
				if c.Rank() == 1 {
					return boom
				}
				acc, out := make([]float32, 100), make([]float32, 100)
				acc[c.Rank()] = 1
				_, err = r.Reduce(ctx, acc, out, acc)
				if errors.Is(err, comm.ErrAborted) {
					abortedSeen.Add(1)
				}
				return err
			})
			if !errors.Is(err, boom) {
				t.Fatalf("Run returned %v, want rank 1's error", err)
			}
			if d := time.Since(start); d > 20*time.Second {
				t.Fatalf("took %v", d)
			}
			if abortedSeen.Load() == 0 {
				t.Fatal("no other rank saw comm.ErrAborted")
			}
		})
		t.Run(m+"/cancelled", func(t *testing.T) {
			l, _ := FlatLayout(10)
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			w := local.New(2)
			r, err := New(m, Options{Density: 0.1, Layout: l, Comm: w.Comm(0)})
			if err != nil {
				t.Fatal(err)
			}
			acc, out := make([]float32, 10), make([]float32, 10)
			if _, err := r.Reduce(ctx, acc, out, acc); !errors.Is(err, context.Canceled) {
				t.Fatalf("Reduce with a cancelled context: %v, want context.Canceled", err)
			}
		})
	}
}

// TestNewRejectsHugeLayouts is a regression test: every method sends or
// stores indices as int32, but only dgc, dragonn, randomk, deft and micro
// refused a layout of more than math.MaxInt32 elements; topk, topka, cltk,
// threshold, gtopk, lags and spardl accepted it (and would have wrapped the
// indices). The layout is only described, never allocated.
func TestNewRejectsHugeLayouts(t *testing.T) {
	l := Layout{Tensors: []Tensor{{Name: "huge", Size: 1 << 31}}, N: 1 << 31}
	c := blSingleComm(t)
	for _, m := range Names() {
		t.Run(m, func(t *testing.T) {
			r, err := New(m, Options{Density: 0.01, Layout: l, Comm: c})
			if err == nil || !strings.Contains(err.Error(), "int32") || !strings.Contains(err.Error(), "2147483648 elements") {
				t.Fatalf("New with 2^31 elements: reducer %T, error %v; want one naming the element count and the int32 limit", r, err)
			}
		})
	}
}

// TestEveryMethodSaysWhetherItProjects: each built-in method declares
// whether its traffic can be projected to other worker counts, with the
// reason when not (the reports read it; a new method must decide).
func TestEveryMethodSaysWhetherItProjects(t *testing.T) {
	for _, m := range Methods() {
		if !m.Projectable && m.NotProjectable == "" {
			t.Errorf("%s declares neither Projectable nor NotProjectable", m.Name)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("Register accepted a method both Projectable and with a reason it is not")
		}
	}()
	Register(Method{Name: "zz-both", New: newDense, Projectable: true, NotProjectable: "x"})
}
