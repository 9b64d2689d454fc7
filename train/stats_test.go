package train

import (
	"context"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// TestStepFieldsCoverStats: every field of stepStats but LayerK travels in
// exactly one stepFields entry (a field added to the struct and not to the
// list would silently stay local).
func TestStepFieldsCoverStats(t *testing.T) {
	typ := reflect.TypeOf(stepStats{})
	hits := map[string]int{}
	names := map[string]bool{}
	for _, f := range stepFields {
		if names[f.name] {
			t.Errorf("two fields named %q", f.name)
		}
		names[f.name] = true
		var s stepStats
		f.set(&s, 7)
		if got := f.get(&s); got != 7 {
			t.Errorf("%s: set 7, got %v", f.name, got)
		}
		v := reflect.ValueOf(s)
		for i := range typ.NumField() {
			if !v.Field(i).IsZero() {
				hits[typ.Field(i).Name]++
			}
		}
	}
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		want := 1
		if name == "LayerK" {
			want = 0
		}
		if hits[name] != want {
			t.Errorf("stepStats.%s is in %d stepFields entries, want %d", name, hits[name], want)
		}
	}
}

// TestGatherStats: the ranks' statistics combine as their fields say: mean
// (in rank order), the critical rank's times (rank 1 here: the largest
// queued + compute + select, though rank 2 has the largest backward,
// iteration and others), sum, rank 0's; the same on every rank; LayerK
// stays local.
func TestGatherStats(t *testing.T) {
	const n = 3
	local3 := func(r int) stepStats {
		f := float64(r + 1)
		st := stepStats{Loss: f, Forward: time.Duration(r+1) * time.Millisecond, Backward: time.Duration(3-r) * time.Second,
			Select: 5, Comm: time.Duration(r), Update: 1, Iter: time.Duration(10 * (r + 1)), Wait: time.Duration(r * r), Compute: 4,
			CommWall: time.Duration(100 - r), Queued: time.Duration(3 * r), Sent: 10 * f, Recv: 100 * f, ErrorNorm: 0.5 * f, ActualDensity: 0.01 * f,
			Threshold: math.NaN(), Samples: 256, LayerK: []int{r}}
		if r == 1 {
			st.Compute = 9 // 3 + 9 + 5 against 0 + 4 + 5 and 6 + 4 + 5
		}
		return st
	}
	for _, tc := range []struct {
		name string
		get  func(stepStats) float64
		want float64
	}{
		{"loss (mean)", func(s stepStats) float64 { return s.Loss }, 2},
		{"forward (critical)", func(s stepStats) float64 { return s.Forward.Seconds() }, 0.002},
		{"backward (critical)", func(s stepStats) float64 { return s.Backward.Seconds() }, 2},
		{"iter (critical)", func(s stepStats) float64 { return float64(s.Iter) }, 20},
		{"wait (critical)", func(s stepStats) float64 { return float64(s.Wait) }, 1},
		{"comm wall (critical)", func(s stepStats) float64 { return float64(s.CommWall) }, 99},
		{"queued (critical)", func(s stepStats) float64 { return float64(s.Queued) }, 3},
		{"compute (critical)", func(s stepStats) float64 { return float64(s.Compute) }, 9},
		{"sent (mean)", func(s stepStats) float64 { return s.Sent }, 20},
		{"recv (mean)", func(s stepStats) float64 { return s.Recv }, 200},
		{"error norm (mean)", func(s stepStats) float64 { return s.ErrorNorm }, 1},
		{"actual density (rank 0)", func(s stepStats) float64 { return s.ActualDensity }, 0.01},
		{"samples (sum)", func(s stepStats) float64 { return float64(s.Samples) }, 3 * 256},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make([]stepStats, n)
			err := local.Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
				s, err := gatherStats(ctx, c, local3(c.Rank()))
				got[c.Rank()] = s
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			for r, s := range got {
				if v := tc.get(s); v != tc.want {
					t.Errorf("rank %d: %v, want %v", r, v, tc.want)
				}
				if !math.IsNaN(s.Threshold) || len(s.LayerK) != 1 || s.LayerK[0] != r {
					t.Errorf("rank %d: threshold %v, layer k %v", r, s.Threshold, s.LayerK)
				}
			}
		})
	}
}
