package data

import (
	"math"
	"slices"
	"testing"
)

var sizes = []int{1, 2, 3, 5, 16}

func TestPermIsBijection(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 4, 5, 7, 16, 17, 100, 1000, 4097, 65537} {
		for _, k := range []uint64{0, 1, 0xdeadbeef} {
			p := NewPerm(n, k)
			if p.Len() != n {
				t.Fatalf("n=%d: Len %d", n, p.Len())
			}
			seen := make([]bool, n)
			for i := 0; i < n; i++ {
				v := p.At(i)
				if v < 0 || v >= n || seen[v] {
					t.Fatalf("n=%d key=%d: At(%d)=%d out of range or repeated", n, k, i, v)
				}
				seen[v] = true
			}
		}
	}
}

func TestPermChangesWithKeyAndLooksRandom(t *testing.T) {
	const n = 10000
	a, b := NewPerm(n, PermKey(1, 0)), NewPerm(n, PermKey(1, 1))
	same, fixed := 0, 0
	var disp float64
	for i := 0; i < n; i++ {
		if a.At(i) == b.At(i) {
			same++
		}
		if a.At(i) == i {
			fixed++
		}
		disp += math.Abs(float64(a.At(i) - i))
	}
	// A random permutation has about one fixed point and agrees with another
	// in about one place; mean displacement is n/3.
	if same > 20 || fixed > 20 {
		t.Errorf("epochs' permutations agree at %d places, %d fixed points: not shuffled", same, fixed)
	}
	if m := disp / n; m < n/3*0.9 || m > n/3*1.1 {
		t.Errorf("mean displacement %.0f, want about %d", m, n/3)
	}
	// Uniform first position: over many keys, At(0) mod 10 is uniform.
	var hist [10]int
	for k := uint64(0); k < 5000; k++ {
		hist[NewPerm(n, k).At(0)%10]++
	}
	for d, c := range hist {
		if c < 400 || c > 600 {
			t.Errorf("At(0) mod 10 == %d in %d of 5000 keys, want about 500", d, c)
		}
	}
}

func TestIntnUniform(t *testing.T) {
	r := newRNG(42)
	for _, n := range []uint64{1, 2, 3, 9, 1000} {
		counts := make([]int, n)
		draws := 2000 * int(n)
		for i := 0; i < draws; i++ {
			v := r.intn(n)
			if v >= n {
				t.Fatalf("intn(%d) = %d", n, v)
			}
			counts[v]++
		}
		// Chi-square with n-1 degrees of freedom; 6 sigma bound.
		var chi float64
		for _, c := range counts {
			d := float64(c) - 2000
			chi += d * d / 2000
		}
		df := float64(n - 1)
		if chi > df+6*math.Sqrt(2*df)+1 {
			t.Errorf("intn(%d): chi-square %.1f for %v degrees of freedom", n, chi, df)
		}
	}
}

// refShard is the obvious sharding: materialise the permutation, take every
// size-th element from rank, drop what does not fill a whole round.
func refShard(n, rank, size int, seed uint64, epoch int, train bool) []int {
	order := make([]int, n)
	p := NewPerm(n, PermKey(seed, epoch))
	for i := range order {
		order[i] = i
		if train {
			order[i] = p.At(i)
		}
	}
	var out []int
	for pos := rank; pos < n; pos += size {
		if train && pos >= n/size*size {
			break
		}
		out = append(out, order[pos])
	}
	return out
}

func TestShardMatchesReference(t *testing.T) {
	for _, n := range []int{0, 1, 2, 3, 7, 16, 100, 1001} {
		for _, size := range sizes {
			for _, train := range []bool{true, false} {
				for epoch := 0; epoch < 3; epoch++ {
					union := map[int]int{}
					total := 0
					for rank := 0; rank < size; rank++ {
						s, err := NewShard(n, rank, size, 7, epoch, train)
						if err != nil {
							t.Fatal(err)
						}
						want := refShard(n, rank, size, 7, epoch, train)
						got := make([]int, s.Len())
						for i := range got {
							got[i] = s.At(i)
						}
						if !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
							t.Fatalf("n=%d size=%d rank=%d train=%v epoch=%d: got %v want %v", n, size, rank, train, epoch, got, want)
						}
						if train && len(got) != n/size {
							t.Fatalf("train shard has %d samples, want %d", len(got), n/size)
						}
						for _, v := range got {
							union[v]++
						}
						total += len(got)
					}
					if len(union) != total {
						t.Fatalf("n=%d size=%d train=%v: shards overlap", n, size, train)
					}
					if !train && total != n {
						t.Fatalf("n=%d size=%d: evaluation shards cover %d of %d", n, size, total, n)
					}
				}
			}
		}
	}
}

func TestShardErrors(t *testing.T) {
	for _, c := range []struct{ n, rank, size, epoch int }{
		{10, 0, 0, 0}, {10, -1, 2, 0}, {10, 2, 2, 0}, {-1, 0, 1, 0}, {10, 0, 1, -1},
	} {
		if _, err := NewShard(c.n, c.rank, c.size, 0, c.epoch, true); err == nil {
			t.Errorf("NewShard(%+v): no error", c)
		}
	}
}
