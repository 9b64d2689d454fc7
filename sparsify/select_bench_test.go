package sparsify

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/device"
)

// selBenchN is ResNet-18's (CIFAR variant) number of parameters.
const selBenchN = 11_173_962

var (
	selBenchOnce sync.Once
	selBenchX    []float32
)

// selBenchData is selBenchN standard-normal values, made once per process.
func selBenchData() []float32 {
	selBenchOnce.Do(func() {
		r := rand.New(rand.NewPCG(1, 2))
		selBenchX = make([]float32, selBenchN)
		for i := range selBenchX {
			selBenchX[i] = float32(r.NormFloat64())
		}
	})
	return selBenchX
}

// selSumAbs is the yardstick: one streaming pass over x (sum of |x|), split
// over the same chunks and goroutines as the selection passes, with eight
// accumulators per chunk so that it is bound by memory, not by add latency.
func selSumAbs(x []float32) float32 {
	p := selChunks(len(x))
	part := make([]float32, p)
	selParallel(len(x), p, func(c, lo, hi int) {
		var s [8]float32
		y := x[lo:hi]
		i := 0
		for ; i+8 <= len(y); i += 8 {
			s[0] += math.Float32frombits(absBits(y[i]))
			s[1] += math.Float32frombits(absBits(y[i+1]))
			s[2] += math.Float32frombits(absBits(y[i+2]))
			s[3] += math.Float32frombits(absBits(y[i+3]))
			s[4] += math.Float32frombits(absBits(y[i+4]))
			s[5] += math.Float32frombits(absBits(y[i+5]))
			s[6] += math.Float32frombits(absBits(y[i+6]))
			s[7] += math.Float32frombits(absBits(y[i+7]))
		}
		for ; i < len(y); i++ {
			s[0] += math.Float32frombits(absBits(y[i]))
		}
		part[c] = s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7]
	})
	var t float32
	for _, v := range part {
		t += v
	}
	return t
}

var selBenchSink float32

// selCPUTime is the CPU time (user + system) this process has used.
func selCPUTime() time.Duration {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0
	}
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

// selBenchVsPass runs op in the benchmark loop and, after each call, one
// yardstick pass (selSumAbs) outside the timer. It reports the ratio of op's
// wall time to the pass's as "x-pass", measured under the same machine load
// as op itself, and the ratio of their CPU times as "x-pass-cpu" (on a
// shared machine wall time also measures the contention; CPU time measures
// the work).
func selBenchVsPass(b *testing.B, x []float32, op func()) {
	var opT, passT, opC, passC time.Duration
	for b.Loop() {
		c0 := selCPUTime()
		t0 := time.Now()
		op()
		t1 := time.Now()
		c1 := selCPUTime()
		b.StopTimer()
		selBenchSink += selSumAbs(x)
		passT += time.Since(t1)
		passC += selCPUTime() - c1
		b.StartTimer()
		opT += t1.Sub(t0)
		opC += c1 - c0
	}
	b.ReportMetric(float64(opT)/float64(passT), "x-pass")
	b.ReportMetric(float64(opC)/float64(passC), "x-pass-cpu")
}

// BenchmarkSelection measures the selection primitives on ResNet-18's size
// against one streaming pass (Pass) over the same vector in the same run.
func BenchmarkSelection(b *testing.B) {
	x := selBenchData()
	var dst []int32
	b.Run("Pass", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		for b.Loop() {
			selBenchSink += selSumAbs(x)
		}
	})
	for _, d := range []float64{0.01, 0.001} {
		k := BudgetK(d, len(x))
		thr := KthLargestAbs(x, k)
		dst = make([]int32, 0, 2*k)
		b.Run(fmt.Sprintf("SelectAbove/d=%g", d), func(b *testing.B) {
			b.SetBytes(int64(4 * len(x)))
			selBenchVsPass(b, x, func() { dst = SelectAbove(dst, x, thr) })
		})
		b.Run(fmt.Sprintf("TopK/d=%g", d), func(b *testing.B) {
			b.SetBytes(int64(4 * len(x)))
			selBenchVsPass(b, x, func() { dst = TopK(dst, x, k) })
		})
		b.Run(fmt.Sprintf("KthLargestAbs/d=%g", d), func(b *testing.B) {
			b.SetBytes(int64(4 * len(x)))
			selBenchVsPass(b, x, func() { selBenchSink += KthLargestAbs(x, k) })
		})
		b.Run(fmt.Sprintf("RandomK/d=%g", d), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				dst = RandomK(dst, len(x), k, uint64(i))
			}
		})
	}
	b.Run("Accumulate", func(b *testing.B) {
		m := NewMemory(len(x), false)
		b.SetBytes(int64(4 * len(x)))
		selBenchVsPass(b, x, func() {
			if _, err := m.Accumulate(x, 1); err != nil {
				b.Fatal(err)
			}
		})
	})
	// The sorting baseline: indices sorted by decreasing magnitude.
	b.Run("SortTopK", func(b *testing.B) {
		b.SetBytes(int64(4 * len(x)))
		k := BudgetK(0.01, len(x))
		idx := make([]int32, len(x))
		for b.Loop() {
			for i := range idx {
				idx[i] = int32(i)
			}
			slices.SortFunc(idx, func(a, c int32) int {
				ma, mc := absBits(x[a]), absBits(x[c])
				switch {
				case ma > mc:
					return -1
				case ma < mc:
					return 1
				}
				return int(a - c)
			})
			dst = append(dst[:0], idx[:k]...)
			slices.Sort(dst)
		}
	})
}

// sampResNet18Layout is the CIFAR ResNet-18's 62 parameter tensors in
// parameter order (11,173,962 elements), for the reducer benchmarks.
func sampResNet18Layout(b *testing.B) Layout {
	var names []string
	var sizes []int
	add := func(name string, size int) { names, sizes = append(names, name), append(sizes, size) }
	add("conv1.weight", 64*27)
	add("bn1.weight", 64)
	add("bn1.bias", 64)
	in := 64
	for s, out := range []int{64, 128, 256, 512} {
		for blk := range 2 {
			cin := out
			if blk == 0 {
				cin = in
			}
			p := fmt.Sprintf("layer%d.%d.", s+1, blk)
			add(p+"conv1.weight", out*cin*9)
			add(p+"bn1.weight", out)
			add(p+"bn1.bias", out)
			add(p+"conv2.weight", out*out*9)
			add(p+"bn2.weight", out)
			add(p+"bn2.bias", out)
			if blk == 0 && cin != out {
				add(p+"shortcut.0.weight", out*cin)
				add(p+"shortcut.1.weight", out)
				add(p+"shortcut.1.bias", out)
			}
		}
		in = out
	}
	add("linear.weight", 5120)
	add("linear.bias", 10)
	l, err := NewLayout(names, sizes)
	if err != nil || l.N != selBenchN || len(l.Tensors) != 62 {
		b.Fatalf("ResNet-18 layout: N = %d, %d tensors, %v", l.N, len(l.Tensors), err)
	}
	return l
}

// BenchmarkSamplingReduce measures one Reduce call of each of 4 in-process
// workers (run concurrently) per iteration on the ResNet-18 layout, for dgc,
// dragonn (no warm-up, default MinTensor) and randomk. cpu-ms/op is the CPU
// time of all four workers together; select-ms/op and comm-ms/op are rank
// 0's wall times.
func BenchmarkSamplingReduce(b *testing.B) {
	const n = 4
	l := sampResNet18Layout(b)
	x := selBenchData()
	for _, m := range []string{"dgc", "dragonn", "randomk"} {
		for _, d := range []float64{0.01, 0.001} {
			b.Run(fmt.Sprintf("%s/d=%g", m, d), func(b *testing.B) {
				world := local.New(n)
				rs := make([]*Reducer, n)
				outs, res := make([][]float32, n), make([][]float32, n)
				for w := range n {
					var err error
					meth, _ := Lookup(m)
					rs[w], err = New(m, Options{Density: d, Layout: l, Comm: world.Comm(w), Seed: 1, Params: meth.Applicable(Values{"dense_warmup": 0})})
					if err != nil {
						b.Fatal(err)
					}
					outs[w], res[w] = make([]float32, l.N), make([]float32, l.N)
				}
				stats := make([]Stats, n)
				var sel, com time.Duration
				c0 := selCPUTime()
				for b.Loop() {
					var wg sync.WaitGroup
					errs := make([]error, n)
					for w := range n {
						wg.Go(func() { stats[w], errs[w] = rs[w].Reduce(b.Context(), x, outs[w], res[w]) })
					}
					wg.Wait()
					for _, err := range errs {
						if err != nil {
							b.Fatal(err)
						}
					}
					sel += stats[0].SelectTime
					com += stats[0].CommTime
				}
				b.ReportMetric(float64((selCPUTime()-c0).Microseconds())/1e3/float64(b.N), "cpu-ms/op")
				b.ReportMetric(float64(sel.Microseconds())/1e3/float64(b.N), "select-ms/op")
				b.ReportMetric(float64(com.Microseconds())/1e3/float64(b.N), "comm-ms/op")
				b.ReportMetric(float64(stats[0].BytesSent), "B-sent/op")
				b.ReportMetric(stats[0].ActualDensity, "actual-density")
			})
		}
	}
}

// BenchmarkSelectDragonnVsDGC measures the selection of DRAGONN and of DGC
// on the same tensors: ResNet-18's tensors of more than 204,800 elements
// (the ones DRAGONN compresses by default: 8 tensors, 10.3 M elements),
// standard-normal values, one worker, all cores. Every iteration runs, in
// turn, DGC's double sampling (dgcSelect), DRAGONN's one-pass selection
// (dragonnSelect) and DRAGONN's former two-pass selection (a threshold
// compaction of the candidates, then their hashed insertion), so that the
// three see the same machine load; each is timed on its own (wall and CPU
// time) and reported per iteration, with the ratios.
func BenchmarkSelectDragonnVsDGC(b *testing.B) {
	l := sampResNet18Layout(b)
	x := selBenchData()
	var big []Tensor
	for _, t := range l.Tensors {
		if t.Size > dragonnDefaultMinTensor {
			big = append(big, t)
		}
	}
	v := newVecs(Options{})
	for _, d := range []float64{0.01, 0.001} {
		b.Run(fmt.Sprintf("d=%g", d), func(b *testing.B) {
			var s samples
			maxSize := 0
			dp := make([]dgcParams, len(big))
			rp := make([]dragonnParams, len(big))
			for i, t := range big {
				maxSize = max(maxSize, t.Size)
				dp[i], rp[i] = dgcParamsFor(t.Size, d), dragonnParamsFor(t.Size, d)
			}
			cand := make([]int32, maxSize)
			var dgcSc dgcScratch
			out := make([]int32, 4*maxSize)
			table := make([]uint32, 4*maxSize)
			var wall, cpu [3]time.Duration
			var sel [3]int
			timed := func(which int, f func() int) {
				c0, t0 := selCPUTime(), time.Now()
				sel[which] += f()
				wall[which] += time.Since(t0)
				cpu[which] += selCPUTime() - c0
			}
			it := 0
			for b.Loop() {
				timed(0, func() int {
					m := 0
					for i, t := range big {
						k, _, err := dgcSelect(&v, &dgcSc, device.Host(cand), device.Host(x[t.Offset:t.Offset+t.Size]), []dgcTensor{{0, t.Size, dp[i], it % dp[i].stride}}, -1)
						if err != nil {
							b.Fatal(err)
						}
						m += k[0]
					}
					return m
				})
				timed(1, func() int {
					m := 0
					for i, t := range big {
						k, _, err := dragonnSelect(&v, &s, device.Host(out[:rp[i].nslots]), device.Host(x[t.Offset:t.Offset+t.Size]), device.Buffer{}, []dragonnTensor{{0, t.Size, rp[i], sampPCG(1, 0, it, i), uint32(43 + i)}}, -1)
						if err != nil {
							b.Fatal(err)
						}
						m += k[0]
					}
					return m
				})
				timed(2, func() int {
					m := 0
					for i, t := range big {
						p := rp[i]
						thr, err := dragonnTwoPassThreshold(&v, &s, x[t.Offset:t.Offset+t.Size], p, sampRNG(1, 0, it, i))
						if err != nil {
							b.Fatal(err)
						}
						c := SelectAbove(cand[:0], x[t.Offset:t.Offset+t.Size], thr)
						m += len(dragonnInsert(out[:0], c, uint32(43+i), table[:p.nslots]))
					}
					return m
				})
				it++
			}
			n := float64(b.N)
			for i, name := range []string{"dgc", "dragonn", "dragonn-2pass"} {
				b.ReportMetric(float64(wall[i].Microseconds())/1e3/n, name+"-ms/op")
				b.ReportMetric(float64(cpu[i].Microseconds())/1e3/n, name+"-cpu-ms/op")
				b.ReportMetric(float64(sel[i])/n, name+"-selected/op")
			}
			b.ReportMetric(float64(wall[1])/float64(wall[0]), "dragonn/dgc")
			b.ReportMetric(float64(cpu[1])/float64(cpu[0]), "dragonn/dgc-cpu")
			b.ReportMetric(float64(wall[1])/float64(wall[2]), "dragonn/2pass")
		})
	}
}

// dragonnTwoPassThreshold is the sampled threshold of dragonnSelect (the
// same draws), for the two-pass variant of BenchmarkSelectDragonnVsDGC.
func dragonnTwoPassThreshold(v *vecs, sc *samples, x []float32, p dragonnParams, rng *rand.Rand) (float32, error) {
	sc.pos = sc.pos[:0]
	for range p.ns {
		sc.pos = append(sc.pos, int32(rng.IntN(p.numel)))
	}
	val := make([]float32, p.ns)
	for j, i := range sc.pos {
		val[j] = x[i]
	}
	return v.ops.KthLargestAbs(v.s, device.Host(val), p.ks)
}

// dragonnInsert is the second pass of the former two-pass selection: the
// candidates (ascending) inserted into table at murmur3 mod its length, the
// occupied slots' indices appended to dst.
func dragonnInsert(dst, cand []int32, seed uint32, table []uint32) []int32 {
	clear(table)
	m := uint32(len(table))
	for _, i := range cand {
		table[murmur3Index(uint32(i), seed)%m] = uint32(i) + 1
	}
	for _, e := range table {
		if e != 0 {
			dst = append(dst, int32(e-1))
		}
	}
	return dst
}

// absBits is the bit pattern of |v|.
func absBits(v float32) uint32 { return math.Float32bits(v) &^ (1 << 31) }
