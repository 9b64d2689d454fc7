package models

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
)

// TestRecordedStep: a recorded model's step writes the given gradient,
// tensor by tensor in descending order when hooked, reports no loss, and
// works the same through a Pool.
func TestRecordedStep(t *testing.T) {
	layout := []ParamInfo{{Name: "a", Shape: []int{2, 3}, Size: 6}, {Name: "s", Shape: nil, Size: 1, Offset: 6}, {Name: "e", Shape: []int{0}, Offset: 7}, {Name: "b", Shape: []int{2}, Size: 2, Offset: 7}}
	m, err := NewRecorded("toy", layout, 8, nil)
	if err != nil {
		t.Fatal(err)
	}
	if m.NumParams() != 9 {
		t.Fatalf("NumParams %d", m.NumParams())
	}
	g := []float32{1, 2, 3, 4, 5, 6, -7, 8, 9}
	for _, pooled := range []bool{false, true} {
		var mm Model = m
		if pooled {
			p, err := NewPool(2, func() (Model, error) { return NewRecorded("toy", layout, 8, nil) })
			if err != nil {
				t.Fatal(err)
			}
			if mm, err = p.Worker(3); err != nil {
				t.Fatal(err)
			}
		}
		for _, hooked := range []bool{false, true} {
			var order []int
			if hooked {
				mm.SetGradHook(func(i int, ev device.Event) { order = append(order, i) })
			} else {
				mm.SetGradHook(nil)
			}
			grad := make([]float32, 9)
			params := make([]float32, 9)
			if err := mm.InitParams(params); err != nil {
				t.Fatal(err)
			}
			res, err := mm.TrainStep(context.Background(), Batch{Gradient: g}, device.Host(params), device.Host(grad))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(grad, g) || !math.IsNaN(res.Loss) {
				t.Fatalf("pooled %v hooked %v: gradient %v loss %v; want %v and NaN", pooled, hooked, grad, res.Loss, g)
			}
			if hooked && !slices.Equal(order, []int{3, 2, 1, 0}) {
				t.Fatalf("hook order %v, want 3 2 1 0", order)
			}
			if !hooked && order != nil {
				t.Fatalf("hook called without a hook")
			}
		}
	}
	if _, err := m.TrainStep(context.Background(), Batch{Gradient: g[:8]}, device.Host(g), device.Host(make([]float32, 9))); err == nil {
		t.Fatal("a gradient of the wrong size was accepted")
	}
	if _, err := m.Evaluate(context.Background(), Batch{}, device.Host(g)); err == nil {
		t.Fatal("a recorded model evaluated")
	}
	if _, err := NewRecorded("x", []ParamInfo{{Name: "a", Shape: []int{2}, Size: 3}}, 1, nil); err == nil {
		t.Fatal("a layout whose shape and size disagree was accepted")
	}
}
