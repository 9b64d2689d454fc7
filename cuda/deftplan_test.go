package cuda_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// deftKernel is DEFT's kernel of that name (sparsify's k_deft_plan or
// k_deft_common).
func deftKernel(t *testing.T, name string) *device.Kernel {
	t.Helper()
	for _, m := range sparsify.Methods() {
		for _, k := range m.Kernels {
			if m.Name == "deft" && k.Name == name {
				return k
			}
		}
	}
	t.Fatalf("deft declares no kernel %s", name)
	return nil
}

// deftPlanCase is one input of DEFT's plan: fragment sizes, this worker's
// norms and the leader's (nil: this worker leads), the budget k, the
// workers, the rank and the cycle, and whether the kernel takes the norms'
// squares (sq) or the norms.
type deftPlanCase struct {
	name              string
	sizes             []int
	norms, leadNorms  []float64
	k, n, rank, cycle int
	sq                bool
}

// deftPlanHandMade are sparsify's deftAllocCases (deft_alloc_test.go): the
// allocation's hand-made adversarial inputs (float rounding of a share,
// fragments smaller than their share, the budget running out, ties, zeros,
// norms at the ends of float64's range).
func deftPlanHandMade() []deftPlanCase {
	return []deftPlanCase{
		{name: "rounding of the last share", sizes: []int{100, 100}, norms: []float64{5.235, 2.1}, k: 62},
		{name: "rounding of a middle share", sizes: []int{100, 100, 100}, norms: []float64{7.703, 2.423, 0.5}, k: 22},
		{name: "last fragment smaller than its share", sizes: []int{100, 1}, norms: []float64{10, 1}, k: 50},
		{name: "all fragments smaller than their share but one", sizes: []int{2, 3, 1, 500, 4}, norms: []float64{9, 8, 7, 0.001, 6}, k: 300},
		{name: "budget runs out before the minimum of 1 each", sizes: []int{50, 50, 50, 50}, norms: []float64{100, 1, 1, 1}, k: 5},
		{name: "ties", sizes: []int{10, 10, 10, 10, 10, 10, 10}, norms: []float64{1, 1, 1, 1, 1, 1, 1}, k: 11},
		{name: "three ties share 200", sizes: []int{100, 100, 100}, norms: []float64{2, 2, 2}, k: 200},
		{name: "ties and zeros", sizes: []int{9, 9, 9, 9, 9}, norms: []float64{0, 2, 0, 2, 2}, k: 20},
		{name: "all norms zero", sizes: []int{5, 7, 3}, norms: []float64{0, 0, 0}, k: 10},
		{name: "zeros after the budget is spent", sizes: []int{2, 40, 3, 40}, norms: []float64{5, 0, 4, 0}, k: 60},
		{name: "huge and tiny ratios", sizes: []int{30, 30, 30, 30}, norms: []float64{1e300, 1e-300, 5e-324, 1}, k: 70},
		{name: "huge norms", sizes: []int{20, 20, 20}, norms: []float64{math.MaxFloat64, math.MaxFloat64, math.MaxFloat64 / 3}, k: 31},
		{name: "subnormal norms only", sizes: []int{8, 8, 8}, norms: []float64{5e-324, 1e-320, 2e-310}, k: 13},
		{name: "k below the number of fragments", sizes: []int{4, 4, 4, 4, 4}, norms: []float64{3, 1, 4, 1, 5}, k: 2},
		{name: "k equals N", sizes: []int{3, 1, 4, 1, 5}, norms: []float64{2, 7, 1, 8, 2}, k: 14},
		{name: "empty fragments", sizes: []int{0, 6, 0, 6, 0}, norms: []float64{0, 1, 0, 3, 0}, k: 7},
		{name: "single fragment", sizes: []int{17}, norms: []float64{0.5}, k: 16},
	}
}

// deftPlanNorms draws norms as sparsify's deftAllocAdversarial does: zeros,
// ties, anywhere in float64's range, small integers, and spread decimals
// (0 for an empty fragment).
func deftPlanNorms(rng *rand.Rand, sizes []int) []float64 {
	norms := make([]float64, len(sizes))
	for f := range norms {
		switch rng.IntN(6) {
		case 0:
		case 1:
			norms[f] = 1
		case 2:
			norms[f] = math.Ldexp(1+rng.Float64(), rng.IntN(2046)-1074)
		case 3:
			norms[f] = float64(1 + rng.IntN(3))
		default:
			norms[f] = rng.ExpFloat64() * math.Pow(10, float64(rng.IntN(12)-6))
		}
		if sizes[f] == 0 {
			norms[f] = 0
		}
	}
	return norms
}

// deftPlanRandom is deftAllocAdversarial's input (many ties and zeros,
// norms across float64's range, fragment sizes of 0, 1 and 2 next to large
// ones, budgets from 1 to N) with a worker count, a rank, a cycle and, for
// a worker that does not lead, the leader's own norms.
func deftPlanRandom(rng *rand.Rand) deftPlanCase {
	L := 1 + rng.IntN(30)
	c := deftPlanCase{sizes: make([]int, L)}
	N := 0
	for f := range L {
		switch rng.IntN(5) {
		case 0:
			c.sizes[f] = rng.IntN(3)
		case 1:
			c.sizes[f] = 1 + rng.IntN(1000)
		default:
			c.sizes[f] = 1 + rng.IntN(20)
		}
		N += c.sizes[f]
	}
	if N == 0 {
		c.sizes[0], N = 1, 1
	}
	c.norms = deftPlanNorms(rng, c.sizes)
	c.k = 1 + rng.IntN(N)
	if rng.IntN(4) == 0 {
		c.k = N - rng.IntN(min(N, 3))
	}
	c.n = []int{1, 2, 3, 5, 16}[rng.IntN(5)]
	c.rank, c.cycle = rng.IntN(c.n), rng.IntN(c.n)
	if c.rank != c.cycle {
		c.leadNorms = deftPlanNorms(rng, c.sizes)
	}
	if rng.IntN(3) == 0 { // squares that stay finite: the kernel's square roots
		c.sq = true
		for _, ns := range [][]float64{c.norms, c.leadNorms} {
			for f, v := range ns {
				ns[f] = math.Ldexp(v, -600)
				if ns[f] == 0 && v != 0 {
					ns[f] = 5e-324
				}
			}
		}
	}
	return c
}

// TestGPUDeftPlanMatchesHost runs DEFT's plan kernel (k_deft_plan) on the
// device and its host pass (the Go allocation, deftAllocator.allocate,
// exact in big integers, and the LPT packing, deftPack) on the same
// inputs — sparsify's hand-made allocation cases and random adversarial
// ones, for 1, 2, 3, 5 and 16 workers, every rank and leader, norms given
// or as squares — and compares the budgets (this worker's and the
// leader's), the bins, the list of this worker's bin, the common
// fragments' starts, the header, and the common fragments' indices
// (k_deft_common). Non-finite sums set the status and nothing else.
func TestGPUDeftPlanMatchesHost(t *testing.T) {
	d := gpu(t)
	s := d.Stream()
	sp := d.Sparse()
	kPlan, kCommon := deftKernel(t, "k_deft_plan"), deftKernel(t, "k_deft_common")
	var cases []deftPlanCase
	for _, c := range deftPlanHandMade() {
		c.n = 1
		cases = append(cases, c)
		for _, n := range []int{2, 3} { // the same norms led by another worker
			c.n, c.rank, c.cycle = n, 1, 0
			c.leadNorms = slices.Clone(c.norms)
			slices.Reverse(c.leadNorms)
			cases = append(cases, c)
		}
	}
	// Beyond sparsify's cases: sums of norms past float64's range times
	// budgets of thousands (the integers' highest limbs), and the same
	// below the least normal number.
	huge := deftPlanCase{name: "30 norms of MaxFloat64", sizes: make([]int, 30), norms: make([]float64, 30), k: 29000, n: 1}
	tiny := deftPlanCase{name: "30 subnormal norms", sizes: make([]int, 30), norms: make([]float64, 30), k: 17001, n: 1}
	for f := range 30 {
		huge.sizes[f], huge.norms[f] = 1000, math.MaxFloat64/31*float64(30-f%3)
		tiny.sizes[f], tiny.norms[f] = 1000, math.Float64frombits(uint64(1+f*f*1237))
	}
	cases = append(cases, huge, tiny)
	rng := rand.New(rand.NewPCG(32, 3))
	for i := range 600 {
		c := deftPlanRandom(rng)
		c.name = fmt.Sprintf("random %d", i)
		cases = append(cases, c)
	}
	nonFinite := deftPlanCase{name: "NaN of the leader", sizes: []int{3, 4}, norms: []float64{1, 2}, leadNorms: []float64{math.NaN(), 1}, k: 3, n: 2, rank: 1}
	cases = append(cases, nonFinite)
	nonFinite.name, nonFinite.norms = "Inf of this worker", []float64{1, math.Inf(1)}
	cases = append(cases, nonFinite)

	upload := func(h any, dt device.DType, n int) device.Buffer {
		b, err := d.Alloc(dt, max(n, 1))
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			var src device.Buffer
			switch v := h.(type) {
			case []float64:
				src = device.Host(v)
			case []int32:
				src = device.Host(v)
			}
			if err := s.Copy(b.Slice(0, n), src); err != nil {
				t.Fatal(err)
			}
		}
		return b
	}
	for _, c := range cases {
		L := len(c.sizes)
		bounds := make([]int32, L+1)
		for f, sz := range c.sizes {
			bounds[f+1] = bounds[f] + int32(sz)
		}
		ss := append(slices.Clone(c.norms), c.leadNorms...)
		lead, sq := int32(0), int32(0)
		if c.leadNorms != nil {
			lead = 1
		}
		if c.sq {
			sq = 1
			for f, v := range ss {
				ss[f] = v * v
			}
		}
		words := 6 + 8*L + c.n // the plan's length (deft.cu's layout)
		listAt := 5 + 5*L + c.n
		hostPlan := make([]int32, words)
		for i := range hostPlan {
			hostPlan[i] = -9
		}
		args := func(ssb, bb, wk, plan device.Buffer) []any {
			return []any{ssb, bb, int64(1), int32(L), int64(c.k), int32(c.n), int32(c.rank), int32(c.cycle), lead, sq, wk, plan}
		}
		dss, db := upload(ss, device.Float64, len(ss)), upload(bounds, device.Int32, L+1)
		dwk, err := d.Alloc(device.Float64, 3*L+c.n)
		if err != nil {
			t.Fatal(err)
		}
		dplan := upload(hostPlan, device.Int32, words) // stale words both must overwrite
		kPlan.Host(1, args(device.Host(ss), device.Host(bounds), device.Host(make([]float64, 3*L+c.n)), device.Host(hostPlan))...)
		if err := sp.Run(s, kPlan, 1, args(dss, db, dwk, dplan)...); err != nil {
			t.Fatal(err)
		}
		got := downloadInt32(t, s, dplan)
		C := int(hostPlan[3])
		S := int(hostPlan[listAt])
		regions := []struct {
			what   string
			lo, hi int
		}{{"header", 0, 4}}
		if hostPlan[0] == 0 {
			regions = append(regions,
				struct {
					what   string
					lo, hi int
				}{"budgets (this worker's, the leader's)", 4, 4 + 2*L},
				struct {
					what   string
					lo, hi int
				}{"bins and their lengths", 4 + 3*L, 4 + 4*L + c.n},
				struct {
					what   string
					lo, hi int
				}{"common fragments' starts", 4 + 4*L + c.n, 4 + 4*L + c.n + C + 1},
				struct {
					what   string
					lo, hi int
				}{"this worker's list", listAt, listAt + 1 + 3*S})
		}
		for _, r := range regions {
			if !slices.Equal(got[r.lo:r.hi], hostPlan[r.lo:r.hi]) {
				t.Fatalf("%s (sizes %v norms %v lead %v k %d n %d rank %d cycle %d sq %v): %s: device %v, host %v",
					c.name, c.sizes, c.norms, c.leadNorms, c.k, c.n, c.rank, c.cycle, c.sq, r.what, got[r.lo:r.hi], hostPlan[r.lo:r.hi])
			}
		}
		if (c.name == nonFinite.name) != (hostPlan[0] == 1) || (c.name == "NaN of the leader") != (hostPlan[0] == 2) {
			t.Fatalf("%s: status %d", c.name, hostPlan[0])
		}
		if nc := int(hostPlan[2]); hostPlan[0] == 0 && nc > 0 {
			hostIdx := make([]int32, nc)
			kCommon.Host(nc, device.Host(hostPlan), device.Host(bounds), int64(nc), int32(L), int32(c.n), device.Host(hostIdx))
			di, err := d.Alloc(device.Int32, nc)
			if err != nil {
				t.Fatal(err)
			}
			if err := sp.Run(s, kCommon, nc, dplan, db, int64(nc), int32(L), int32(c.n), di); err != nil {
				t.Fatal(err)
			}
			if gi := downloadInt32(t, s, di); !slices.Equal(gi, hostIdx) {
				t.Fatalf("%s: common indices: device %v, host %v", c.name, gi, hostIdx)
			}
			d.Free(di)
		}
		for _, b := range []device.Buffer{dss, db, dwk, dplan} {
			d.Free(b)
		}
	}
}

// TestGPUDeftNonFiniteSaysWhere: a NaN in the leader's acc stops DEFT on
// the GPU with the CPU's errors — the leader's names its fragment, the
// other worker's the leader's broadcast norms — though the host reads the
// norms only on that path (the plan's status says they are not finite).
func TestGPUDeftNonFiniteSaysWhere(t *testing.T) {
	d := gpu(t)
	layout, err := sparsify.NewLayout([]string{"a", "b"}, []int{10, 20})
	if err != nil {
		t.Fatal(err)
	}
	run := func(onGPU bool) []string {
		w := local.New(2)
		msgs := make([]string, 2)
		var wg sync.WaitGroup
		for rank := range 2 {
			wg.Go(func() {
				o := sparsify.Options{Density: 0.2, Layout: layout, Comm: w.Comm(rank)}
				var s device.Stream
				if onGPU {
					var err error
					if s, err = d.NewStream(); err != nil {
						msgs[rank] = err.Error()
						return
					}
					o.Comm, o.Stream, o.Ops = comm.Staged(o.Comm), s, d.Sparse()
				}
				r, err := sparsify.New("deft", o)
				if err != nil {
					msgs[rank] = err.Error()
					return
				}
				acc := make([]float32, layout.N)
				for i := range acc {
					acc[i] = float32(i%7) - 3
				}
				if rank == 0 { // the leader of the first call
					acc[17] = float32(math.NaN())
				}
				out := make([]float32, layout.N)
				if onGPU {
					res, ob := upload(t, s, acc), upload(t, s, out)
					_, err = r.ReduceOn(context.Background(), res, ob, res)
				} else {
					_, err = r.Reduce(context.Background(), acc, out, acc)
				}
				if err != nil {
					msgs[rank] = err.Error()
				}
			})
		}
		wg.Wait()
		return msgs
	}
	cpu, gpu := run(false), run(true)
	if !strings.Contains(cpu[0], `acc holds NaN or infinite values in fragment`) || !strings.Contains(cpu[1], "the norms broadcast by leader 0 hold") {
		t.Fatalf("the CPU's errors: %q", cpu)
	}
	if !slices.Equal(cpu, gpu) {
		t.Fatalf("the GPU's errors %q, the CPU's %q", gpu, cpu)
	}
}
