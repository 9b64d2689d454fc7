package cuda_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/train"
)

// twoGPUs returns two freshly opened GPUs (on the emulator: two emulated
// ones), closed when t ends, or skips the test on a machine with one.
func twoGPUs(t *testing.T) [2]*cuda.Device {
	gpu(t)
	if !cuda.EmulateGPUs(t, 2) {
		if n, err := cuda.Count(); err != nil || n < 2 {
			t.Skip("needs two GPUs (or the emulator)")
		}
	}
	var devs [2]*cuda.Device
	for i := range devs {
		d, err := cuda.Open(i, cuda.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { d.Close() })
		devs[i] = d
	}
	return devs
}

// TestCollectivesAcrossGPUs: in-process ranks on two GPUs, rank r on GPU
// r mod 2 (as train puts its workers), all-reduce (blocking, and
// non-blocking on int32), all-gather, all-gather with counts (an empty
// one among them), broadcast and SendRecv device buffers. Where the GPUs
// reach each other's memory (peer access; the emulated GPUs do, as GPUs
// joined by NVLink) the calls run on the GPUs: each rank's kernel adds its
// chunk of every rank's buffer in the canonical order, so the bits are the
// host collective's, no byte crosses the host and the host waits for
// nothing; peer access was enabled both ways. Where they do not (answered
// "no"), the same calls are staged through host memory, with the same
// bits.
func TestCollectivesAcrossGPUs(t *testing.T) {
	for _, peer := range []bool{true, false} {
		for _, n := range []int{3, 4, 5} {
			t.Run(fmt.Sprintf("peer=%v/%d", peer, n), func(t *testing.T) {
				if !peer && !cuda.NoPeerAccess(t) {
					t.Skip("answers no to peer access on the emulator")
				}
				devs := twoGPUs(t)
				testCollectivesAcrossGPUs(t, devs, n, peer)
			})
		}
	}
}

func testCollectivesAcrossGPUs(t *testing.T, devs [2]*cuda.Device, n int, peer bool) {
	const L = 1037
	rng := rand.New(rand.NewPCG(uint64(n), 32))
	xs := make([][]float32, n)
	is := make([][]int32, n)
	for r := range n {
		xs[r] = randVec(rng, L, 1)
		is[r] = make([]int32, L)
		for i := range is[r] {
			is[r][i] = rng.Int32N(1<<20) - 1<<19
		}
	}
	counts := make([]int, n)
	total := 0
	for r := range counts {
		counts[r] = (r * 7) % 5 // 0, 2, 4, 1, 3
		total += counts[r]
	}
	// bufs are a rank's buffers, in the order of the calls (the float32
	// ones, then the int32 one).
	type bufs struct {
		f []comm.Buffer
		i comm.Buffer
	}
	mkAll := func(r int, mk func([]float32) comm.Buffer, mki func([]int32) comm.Buffer) bufs {
		return bufs{f: []comm.Buffer{
			mk(xs[r]), mk(xs[r][:10]), mk(make([]float32, 10*n)), // all-reduce, all-gather
			mk(xs[r][1 : 1+counts[r]]), mk(make([]float32, total)), // all-gather with counts
			mk(xs[r][:333]),                             // broadcast
			mk(xs[r][:7+r]), mk(make([]float32, 7+n+3)), // SendRecv
		}, i: mki(is[r])}
	}
	script := func(ctx context.Context, c comm.Communicator, r int, b bufs) error {
		if err := c.AllReduce(ctx, b.f[0]); err != nil {
			return err
		}
		if err := c.AllGather(ctx, b.f[1], b.f[2]); err != nil {
			return err
		}
		if err := c.AllGatherV(ctx, b.f[3], b.f[4], counts); err != nil {
			return err
		}
		if err := c.Broadcast(ctx, b.f[5], n-1); err != nil {
			return err
		}
		q, err := comm.IAllReduce(ctx, c, b.i)
		if err != nil {
			return err
		}
		if m, err := c.SendRecv(ctx, b.f[6], (r+1)%n, b.f[7], (r+n-1)%n, 3); err != nil || m != 7+(r+n-1)%n {
			return fmt.Errorf("rank %d's SendRecv: %d elements, %w", r, m, err)
		}
		_, err = q.Wait(ctx)
		return err
	}
	runAll := func(comms func(r int) comm.Communicator, b []bufs) {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r := range n {
			wg.Go(func() { errs[r] = script(context.Background(), comms(r), r, b[r]) })
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			t.Fatal(err)
		}
	}
	// On the host.
	host := make([]bufs, n)
	for r := range n {
		host[r] = mkAll(r, func(x []float32) comm.Buffer { return comm.Float32s(slices.Clone(x)) },
			func(x []int32) comm.Buffer { return comm.Int32s(slices.Clone(x)) })
	}
	hw := local.New(n)
	runAll(hw.Comm, host)
	// On the GPUs, every buffer made before the calls.
	streams := make([]device.Stream, n)
	dev := make([]bufs, n)
	for r := range n {
		d := devs[r%2]
		s, err := d.NewStream()
		if err != nil {
			t.Fatal(err)
		}
		streams[r] = s
		dev[r] = mkAll(r, func(x []float32) comm.Buffer { return comm.OnDevice(upload(t, s, x), s) },
			func(x []int32) comm.Buffer {
				b := allocInt32(t, d, len(x))
				if err := s.Copy(b, device.Host(x)); err != nil {
					t.Fatal(err)
				}
				if err := s.Synchronize(); err != nil {
					t.Fatal(err)
				}
				return comm.OnDevice(b, s)
			})
	}
	w := local.New(n)
	before := cuda.Counts()
	runAll(func(r int) comm.Communicator { return comm.Staged(w.Comm(r)) }, dev)
	got := cuda.Counts().Sub(before)
	for r := range n {
		s := streams[r]
		for i, b := range dev[r].f {
			g, want := download(t, s, b.(comm.Device).Buf), []float32(host[r].f[i].(comm.Float32s))
			if !sameBits(g, want) {
				t.Fatalf("rank %d (GPU %d), call buffer %d: %v…, the host's %v…", r, r%2, i, g[:min(3, len(g))], want[:min(3, len(want))])
			}
		}
		if g := downloadInt32(t, s, dev[r].i.(comm.Device).Buf); !slices.Equal(g, []int32(host[r].i.(comm.Int32s))) {
			t.Fatalf("rank %d (GPU %d): the int32 all-reduce differs from the host's", r, r%2)
		}
	}
	// The host's sums are the canonical order's (element 0 is in rank 0's
	// chunk: ranks 1, …, n−1, then 0), so the comparison means something.
	want := xs[1][0]
	for r := 2; r < n; r++ {
		want += xs[r][0]
	}
	if want += xs[0][0]; host[n-1].f[0].(comm.Float32s)[0] != want {
		t.Fatalf("the host all-reduce: %v, want %v", host[n-1].f[0].(comm.Float32s)[0], want)
	}
	if !peer {
		if got.HtoD == 0 || got.DtoH == 0 {
			t.Errorf("GPUs without peer access: %v; want the calls staged through host memory", got)
		}
		t.Logf("staged: %v", got)
		return
	}
	if got.HtoD != 0 || got.DtoH != 0 || got.Syncs != 0 || got.Allocs != 0 || got.PinnedAllocs != 0 {
		t.Errorf("%d ranks on 2 GPUs with peer access: %v; want no byte across the host, no host wait, no allocation", n, got)
	}
	if !cuda.PeerAccessEnabled(0, 1) || !cuda.PeerAccessEnabled(1, 0) {
		if cuda.Emulated() {
			t.Errorf("peer access not enabled both ways")
		}
	}
	t.Logf("on the GPUs: %v", got)
}

// TestTrainAcrossGPUs: train with -device cuda -workers 4 on two GPUs
// (rank r on GPU r mod 2; on the emulator two emulated GPUs with peer
// access), dense, topk (all-gathers) and spardl (SendRecvs), gives the
// losses of the same run on one GPU bit for bit, and the
// CPU run's within float32 rounding; after the first two steps a step
// uploads its batch only and asks the host for what the one-GPU step asks
// (the collectives run on the GPUs). With peer access answered "no" the
// run stages its collectives through host memory, with the same losses.
func TestTrainAcrossGPUs(t *testing.T) {
	gpu(t)
	cuda.KeepAnchor(t)
	methods := []string{"dense", "topk", "spardl"}
	if testing.Short() {
		methods = methods[:1]
	}
	for _, sp := range methods {
		t.Run(sp, func(t *testing.T) {
			c := budgetCase{model: "ncf", method: sp, workers: 4}
			losses := func(t *testing.T, dev string, steps int) ([]float64, cuda.HostCounts) {
				cfg := budgetConfig(t, c, steps)
				cfg.Device = dev
				var ls []float64
				ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
				defer cancel()
				before := cuda.Counts()
				if err := train.Run(ctx, cfg, train.Options{LossSink: func(_ int, l float64) { ls = append(ls, l) }}); err != nil {
					t.Fatalf("%s on %s: %v", sp, dev, err)
				}
				return ls, cuda.Counts().Sub(before)
			}
			const steps = 4
			type result struct {
				losses []float64
				step   cuda.HostCounts // steps 3 and 4
			}
			// gpus runs the case on n GPUs: the losses of 4 steps and the
			// counts of steps 3 and 4.
			gpus := func(n int, peer bool) result {
				var res result
				t.Run(fmt.Sprintf("%d GPUs, peer %v", n, peer), func(t *testing.T) {
					if n > 1 && !cuda.EmulateGPUs(t, n) {
						t.Skip("runs on emulated GPUs")
					}
					if !peer && !cuda.NoPeerAccess(t) {
						t.Skip("answers no to peer access on the emulator")
					}
					short, c2 := losses(t, "cuda", 2)
					ls, c4 := losses(t, "cuda", steps)
					if !slices.Equal(short, ls[:2]) {
						t.Fatalf("the first two steps' losses differ between runs: %v, %v", short, ls[:2])
					}
					res = result{ls, c4.Sub(c2)}
				})
				return res
			}
			cpu, _ := losses(t, "cpu", steps)
			one := gpus(1, true)
			two := gpus(2, true)
			staged := gpus(2, false)
			if len(one.losses) != steps || len(two.losses) != steps || len(staged.losses) != steps {
				t.Fatalf("losses: one GPU %v, two %v, two without peer access %v", one.losses, two.losses, staged.losses)
			}
			for i := range cpu {
				if math.Abs(cpu[i]-one.losses[i]) > 1e-4*math.Abs(cpu[i]) {
					t.Errorf("step %d: CPU loss %v, GPU %v", i+1, cpu[i], one.losses[i])
				}
			}
			if !slices.Equal(two.losses, one.losses) || !slices.Equal(staged.losses, one.losses) {
				t.Errorf("losses on one GPU %v, on two %v, on two without peer access %v: want them equal", one.losses, two.losses, staged.losses)
			}
			per := func(v int64) float64 { return float64(v) / float64(2*c.workers) }
			for _, r := range []struct {
				what string
				c    cuda.HostCounts
			}{{"one GPU", one.step}, {"two GPUs with peer access", two.step}, {"two GPUs without", staged.step}} {
				t.Logf("%s, per worker and step: %.2f launches, %.2f syncs, %.0f B to the device, %.0f B to the host, %.2f allocations",
					r.what, per(r.c.Launches), per(r.c.Syncs), per(r.c.HtoD), per(r.c.DtoH), per(r.c.Allocs))
			}
			if b := batchBytes["ncf"]; per(two.step.HtoD) != float64(b) {
				t.Errorf("two GPUs: %g B to the device per worker and step, want the batch's %d", per(two.step.HtoD), b)
			}
			if two.step.Launches != one.step.Launches || two.step.Syncs != one.step.Syncs || two.step.DtoH != one.step.DtoH || two.step.Allocs != 0 || two.step.Frees != 0 {
				t.Errorf("a step on two GPUs asks the host for more than on one: %v, against %v", two.step, one.step)
			}
			if staged.step.HtoD <= two.step.HtoD {
				t.Errorf("without peer access %d B to the device in two steps, with %d: want the staging to show", staged.step.HtoD, two.step.HtoD)
			}
		})
	}
}
