package advise

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/layout"
)

// refSchedule is a plain event simulation of DDP's overlapped all-reduce:
// the tensors in reverse layout order (DDP's reverse parameter order), each
// added to the current bucket, which is closed once it holds its cap (MiB)
// or more; a single communication queue serves the buckets in order, each
// starting when its last tensor is ready. It returns when the last
// all-reduce ends and the number of buckets.
func refSchedule(sizes []int, ready []float64, P int, net netmodel.Network, firstMB, capMB float64) (end float64, buckets int) {
	var queueFree float64
	flush := func(bytes int, readyAt float64) {
		start := math.Max(readyAt, queueFree)
		queueFree = start + net.Cost(comm.OpAllReduce, P, bytes, 1, nil).Seconds()
		buckets++
	}
	capBytes := firstMB * (1 << 20)
	bytes, readyAt, n := 0, 0.0, 0
	for i := len(sizes) - 1; i >= 0; i-- {
		bytes += 4 * sizes[i]
		readyAt = math.Max(readyAt, ready[i])
		n++
		if float64(bytes) >= capBytes {
			flush(bytes, readyAt)
			bytes, readyAt, n = 0, 0, 0
			capBytes = capMB * (1 << 20)
		}
	}
	if n > 0 {
		flush(bytes, readyAt)
	}
	return queueFree, buckets
}

// TestDDPScheduleMatchesReference compares the advisor's overlapped dense
// schedule with the plain simulation on random per-layer sizes and ready
// times (worker counts 1, 2, 3, 5, 16; a single tensor; tensors larger
// than the cap), and checks its invariants: every tensor in one bucket,
// no bucket over its cap before its last tensor, no all-reduce before its
// bucket is ready or before the previous one ended.
func TestDDPScheduleMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for trial := range 200 {
		n := 1 + rng.IntN(40)
		sizes := make([]int, n)
		ready := make([]float64, n)
		for i := range sizes {
			sizes[i] = 1 + rng.IntN(1<<uint(rng.IntN(24)))
			ready[i] = rng.Float64() * 0.1
			if rng.IntN(5) == 0 && i > 0 {
				ready[i] = ready[i-1] // ties
			}
		}
		P := []int{1, 2, 3, 5, 16}[trial%5]
		net := netmodel.Network{Latency: time.Duration(rng.IntN(100)) * time.Microsecond, Bandwidth: 1e8 + rng.Float64()*1e10}
		capMB := []float64{25, 1, 0.5, 100}[trial%4]
		first := min(FirstBucketMB, capMB)
		lay, err := layout.New(names(n), sizes)
		if err != nil {
			t.Fatal(err)
		}
		bs := ddpSchedule(lay, ready, P, net, first, capMB)
		wantEnd, wantN := refSchedule(sizes, ready, P, net, first, capMB)
		if len(bs) != wantN || math.Abs(bs[len(bs)-1].End-wantEnd) > 1e-9*max(1, wantEnd) {
			t.Fatalf("trial %d: %d buckets ending at %g, reference %d ending at %g", trial, len(bs), bs[len(bs)-1].End, wantN, wantEnd)
		}
		seen := make([]int, n)
		prevEnd := 0.0
		for j, b := range bs {
			limit := capMB * (1 << 20)
			if j == 0 {
				limit = first * (1 << 20)
			}
			if lastT := b.Tensors[len(b.Tensors)-1]; float64(4*(b.Elems-sizes[lastT])) >= limit {
				t.Fatalf("trial %d: bucket %d of %d bytes reached its cap %g before its last tensor", trial, j, 4*b.Elems, limit)
			}
			for _, x := range b.Tensors {
				seen[x]++
				if ready[x] > b.Start {
					t.Fatalf("trial %d: bucket %d starts at %g before tensor %d is ready at %g", trial, j, b.Start, x, ready[x])
				}
			}
			if b.Start < prevEnd {
				t.Fatalf("trial %d: bucket %d starts at %g before the previous one ends at %g", trial, j, b.Start, prevEnd)
			}
			prevEnd = b.End
		}
		for x, c := range seen {
			if c != 1 {
				t.Fatalf("trial %d: tensor %d in %d buckets", trial, x, c)
			}
		}
	}
}

// TestOverlappedDense: the advisor's dense is DDP's by default (its
// all-reduce hidden behind the backward pass but for the tail) and the
// non-overlapped one with NoOverlap; on a fast network the overlapped
// iteration is the computation's, on a slow one at least the
// communication's.
func TestOverlappedDense(t *testing.T) {
	sizes := []int{1000, 200000, 3000000, 64, 5000000}
	lay, err := layout.New(names(len(sizes)), sizes)
	if err != nil {
		t.Fatal(err)
	}
	h := &Host{Model: "m", Layout: lay, Compute: 0.3, Forward: 0.1, Backward: 0.2, Update: 0.01}
	for _, c := range []struct {
		gbits float64
	}{{1}, {10}, {100}, {1000}} {
		net := netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: c.gbits * 1e9 / 8}
		on, err := Predict(h, Setting{Method: "dense", Workers: 8, Density: 0.01, Net: net})
		if err != nil {
			t.Fatal(err)
		}
		off, err := Predict(h, Setting{Method: "dense", Workers: 8, Density: 0.01, Net: net, NoOverlap: true})
		if err != nil {
			t.Fatal(err)
		}
		if !on.Overlapped || off.Overlapped || on.Buckets < 2 {
			t.Fatalf("%g Gbit/s: overlapped %v (%d buckets), off %v", c.gbits, on.Overlapped, on.Buckets, off.Overlapped)
		}
		if on.Iter > off.Iter+float64(on.Buckets)*net.Latency.Seconds()*16 || on.Iter < h.Compute+h.Update {
			t.Errorf("%g Gbit/s: overlapped %v, not overlapped %v, computation %v", c.gbits, on.Iter, off.Iter, h.Compute+h.Update)
		}
		if on.Iter < h.Forward+on.Comm+h.Update-1e-12 {
			t.Errorf("%g Gbit/s: overlapped iteration %v shorter than the forward pass and the all-reduces %v", c.gbits, on.Iter, h.Forward+on.Comm+h.Update)
		}
		if math.Abs(off.Iter-(h.Compute+off.Comm+h.Update)) > 1e-12 {
			t.Errorf("%g Gbit/s: not overlapped %v, want compute + comm + update %v", c.gbits, off.Iter, h.Compute+off.Comm+h.Update)
		}
	}
}

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = string(rune('a' + i))
	}
	return out
}

// TestOverlappedDenseSimulatedHostFloor: simulated workers' buckets last at
// least the host's in-process all-reduce of them (comm/local counts the
// sums towards the emulated time): on an emulated network faster than the
// host's sums the buckets take the host's time, on a slower one the
// network's; a cluster's prediction is the network's alone.
func TestOverlappedDenseSimulatedHostFloor(t *testing.T) {
	sizes := []int{1000, 200000, 3000000, 64, 5000000}
	lay, err := layout.New(names(len(sizes)), sizes)
	if err != nil {
		t.Fatal(err)
	}
	host := netmodel.Network{Latency: 200 * time.Microsecond, Bandwidth: 2e9 / 8}
	for _, P := range []int{2, 3, 5} {
		h := &Host{Model: "m", Layout: lay, Compute: 0.3, Forward: 0.1, Backward: 0.2, Update: 0.01, Cores: 2, StepCores: 1,
			HostNets: []HostNet{{Workers: 2, Latency: host.Latency, Bandwidth: host.Bandwidth}}}
		for _, c := range []struct {
			net       netmodel.Network
			hostSlows bool
		}{
			{netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: 10e9 / 8}, true},
			{netmodel.Network{Latency: time.Millisecond, Bandwidth: 0.5e9 / 8}, false},
		} {
			predict := func(s Setting) Prediction {
				t.Helper()
				s.Method, s.Workers, s.Density = "dense", P, 0.01
				pr, err := Predict(h, s)
				if err != nil {
					t.Fatal(err)
				}
				return pr
			}
			sim := predict(Setting{Net: c.net, Simulated: true})
			cluster := predict(Setting{Net: c.net})
			onHost := predict(Setting{Net: host})
			want := cluster.Comm
			if c.hostSlows {
				want = onHost.Comm
			}
			if !sim.Overlapped || math.Abs(sim.Comm-want) > 1e-12 {
				t.Errorf("P=%d, %v: simulated workers' buckets take %v, want %v (the network's %v, the host's %v)", P, c.net.Bandwidth, sim.Comm, want, cluster.Comm, onHost.Comm)
			}
			if c.hostSlows && !(cluster.Comm < sim.Comm) {
				t.Errorf("P=%d: a cluster's buckets take %v, not the network's alone (simulated %v)", P, cluster.Comm, sim.Comm)
			}
		}
	}
}
