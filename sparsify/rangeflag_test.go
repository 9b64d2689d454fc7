package sparsify

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
)

// TestCheckRange: Env.checkRange of lists against their bounds reports,
// when the call's checks are read (rangeErr), the first check that failed
// with its first index outside (position and value) — compared with a
// plain scan — leaves the lists' indices in range (those outside become 0,
// the others unchanged), and after a failed call or one without failures
// the next call's checks start clear. Lists: empty, one element, and
// random ones of awkward lengths with and without indices outside.
func TestCheckRange(t *testing.T) {
	l, err := FlatLayout(10)
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(Options{Density: 0.5, Layout: l, Comm: local.New(1).Comm(0)})
	rng := rand.New(rand.NewPCG(4, 4))
	for call := range 30 {
		type list struct {
			idx []int32
			lim int
		}
		var lists []list
		for range rng.IntN(5) {
			n, lim := []int{0, 1, 7, 1000}[rng.IntN(4)], 1+rng.IntN(50)
			x := make([]int32, n)
			for i := range x {
				x[i] = int32(rng.IntN(lim))
				if rng.IntN(200) == 0 {
					x[i] = int32(lim + rng.IntN(3))
				}
				if rng.IntN(300) == 0 {
					x[i] = -1 - int32(rng.IntN(3))
				}
			}
			lists = append(lists, list{x, lim})
		}
		// The plain scan: the first list with an index outside, and its first.
		want := ""
		for j, li := range lists {
			if i := slices.IndexFunc(li.idx, func(v int32) bool { return v < 0 || int(v) >= li.lim }); i >= 0 && want == "" {
				want = fmt.Sprintf("list %d: index %d (element %d of the list) is outside [0, %d)", j, li.idx[i], i, li.lim)
			}
		}
		bufs := make([][]int32, len(lists))
		for j, li := range lists {
			bufs[j] = slices.Clone(li.idx)
			err := e.checkRange(device.Host(bufs[j]), li.lim, func(err error) error { return fmt.Errorf("list %d: %w", j, err) })
			if err != nil {
				t.Fatal(err)
			}
		}
		if call%7 == 3 {
			e.forgetRanges() // a call that failed elsewhere: its flags are not read
			continue
		}
		got := ""
		if err := e.rangeErr(); err != nil {
			got = err.Error()
		}
		if got != want {
			t.Fatalf("call %d: %q, want %q", call, got, want)
		}
		for j, li := range lists {
			for i, v := range li.idx {
				w := v
				if v < 0 || int(v) >= li.lim {
					w = 0
				}
				if bufs[j][i] != w {
					t.Fatalf("call %d list %d element %d: %d after the check, want %d", call, j, i, bufs[j][i], w)
				}
			}
		}
	}
	if err := e.rangeErr(); err != nil {
		t.Fatalf("a call without checks: %v", err)
	}
}
