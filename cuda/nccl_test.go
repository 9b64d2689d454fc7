package cuda

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ebitengine/purego"
	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// The NCCL communicator's conformance: every operation on every rank
// against a plain computation on the host, for 1, 2 and 3 ranks (on a GPU
// machine: as many ranks as GPUs, NCCL needing one GPU per rank), and the
// abort of a communicator whose peer never calls. On the emulator the fake
// NCCL (emu_nccl_test.go) plays NCCL; on a GPU it is the real library.

// ncclRanks returns the rank counts to test and opens their devices.
func ncclRanks(t *testing.T) []int {
	t.Helper()
	if emulated {
		old := emuGPUs
		emuGPUs = 3
		t.Cleanup(func() { emuGPUs = old })
		return []int{1, 2, 3}
	}
	if err := loadNCCL(); err != nil {
		if errors.Is(err, device.ErrUnavailable) {
			testenv.Missing(t, testenv.GPU, fmt.Sprintf("no NCCL: %v", err))
		}
		t.Fatal(err)
	}
	n, err := Count()
	if err != nil || n == 0 {
		testenv.Missing(t, testenv.GPU, fmt.Sprintf("no GPU: %v", err))
	}
	var sizes []int
	for s := 1; s <= n; s++ {
		sizes = append(sizes, s)
	}
	return sizes
}

// ncclGroup opens one device and one NCCL rank per GPU.
func ncclGroup(t *testing.T, size int) ([]*Device, []*NCCL) {
	t.Helper()
	id, err := NewNCCLID()
	if err != nil {
		t.Fatal(err)
	}
	devs := make([]*Device, size)
	comms := make([]*NCCL, size)
	for r := range size {
		if devs[r], err = Open(r, Options{}); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() { comms[r], errs[r] = NewNCCL(ctx, devs[r], id, r, size) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for r := range size {
			comms[r].Close()
			devs[r].Close()
		}
	})
	return devs, comms
}

// onEvery runs f on every rank concurrently and fails on any error.
func onEvery(t *testing.T, size int, f func(r int) error) {
	t.Helper()
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
}

func put[E float32 | float64 | int32 | int64 | uint16](t *testing.T, d *Device, x []E) comm.Device {
	t.Helper()
	var dt device.DType
	switch any(x).(type) {
	case []uint16:
		dt = device.Float16
	case []float32:
		dt = device.Float32
	case []float64:
		dt = device.Float64
	case []int32:
		dt = device.Int32
	default:
		dt = device.Int64
	}
	b, err := d.Alloc(dt, len(x))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.def.Copy(b, device.Host(x)); err != nil {
		t.Fatal(err)
	}
	if err := d.def.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return comm.OnDevice(b, d.def)
}

func get[E float32 | float64 | int32 | int64 | uint16](t *testing.T, d *Device, cb comm.Buffer) []E {
	t.Helper()
	b := cb.(comm.Device).Buf
	x := make([]E, b.Len())
	if err := d.def.Copy(device.Host(x), b); err != nil {
		t.Fatal(err)
	}
	if err := d.def.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return x
}

// close32 compares float32 sums that may have been added in another order.
func close32(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(float64(a[i])-float64(b[i])) > 1e-5*(1+math.Abs(float64(b[i]))) {
			return false
		}
	}
	return true
}

func TestNCCLConformance(t *testing.T) {
	for _, size := range ncclRanks(t) {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			devs, comms := ncclGroup(t, size)
			ctx := context.Background()
			rng := rand.New(rand.NewPCG(uint64(size), 5))
			const n = 1001
			// Inputs: rank r's float32 and int64 vectors.
			xs := make([][]float32, size)
			is := make([][]int64, size)
			for r := range size {
				xs[r] = make([]float32, n)
				is[r] = make([]int64, n)
				for i := range n {
					xs[r][i] = float32(rng.NormFloat64())
					is[r][i] = rng.Int64N(1<<40) - 1<<39
				}
			}
			sum := make([]float32, n)
			isum := make([]int64, n)
			for r := range size {
				for i := range n {
					sum[i] += xs[r][i]
					isum[i] += is[r][i]
				}
			}

			// AllReduce, float32 and int64.
			onEvery(t, size, func(r int) error {
				b, ib := put(t, devs[r], xs[r]), put(t, devs[r], is[r])
				if err := comms[r].AllReduce(ctx, b); err != nil {
					return err
				}
				if err := comms[r].AllReduce(ctx, ib); err != nil {
					return err
				}
				if !close32(get[float32](t, devs[r], b), sum) {
					return fmt.Errorf("rank %d: all-reduce sum differs", r)
				}
				if !slices.Equal(get[int64](t, devs[r], ib), isum) {
					return fmt.Errorf("rank %d: int64 all-reduce differs", r)
				}
				return nil
			})

			// AllReduce of half precision (ncclHalf): every addition rounded
			// to half, in NCCL's order, so within size−1 roundings (half an
			// ulp of a partial sum, at most of Σ|h|, each) of the exact sum
			// of the halves; the sum of one rank
			// is its own bits. An all-gather of halves moves the bits.
			hs := make([][]uint16, size)
			for r := range size {
				hs[r] = make([]uint16, n)
				for i := range n {
					hs[r][i] = device.ToFloat16(xs[r][i])
				}
			}
			onEvery(t, size, func(r int) error {
				b := put(t, devs[r], hs[r])
				if err := comms[r].AllReduce(ctx, b); err != nil {
					return err
				}
				got := get[uint16](t, devs[r], b)
				for i := range n {
					exact, mag := 0.0, 0.0
					for q := range size {
						h := float64(device.FromFloat16(hs[q][i]))
						exact += h
						mag += math.Abs(h)
					}
					g := float64(device.FromFloat16(got[i]))
					// half's ulp at |x| is 2^(e−10), at least 2^−24.
					ulp := math.Max(math.Pow(2, math.Floor(math.Log2(math.Max(mag, 1e-30)))-10), 0x1p-24)
					if size == 1 && got[i] != hs[r][i] || math.Abs(g-exact) > float64(size)*ulp {
						return fmt.Errorf("rank %d: half all-reduce [%d] = %v, exact sum of the halves %v", r, i, g, exact)
					}
				}
				send := put(t, devs[r], hs[r][:9])
				recv := put(t, devs[r], make([]uint16, 9*size))
				if err := comms[r].AllGather(ctx, send, recv); err != nil {
					return err
				}
				var want []uint16
				for q := range size {
					want = append(want, hs[q][:9]...)
				}
				if got := get[uint16](t, devs[r], recv); !slices.Equal(got, want) {
					return fmt.Errorf("rank %d: half all-gather %v, want %v", r, got, want)
				}
				return nil
			})

			// AllGather and AllGatherV (a rank with nothing included).
			counts := make([]int, size)
			for r := range size {
				counts[r] = (r * 37) % 50 // rank 0 sends nothing
			}
			onEvery(t, size, func(r int) error {
				send := put(t, devs[r], xs[r][:10])
				recv := put(t, devs[r], make([]float32, 10*size))
				if err := comms[r].AllGather(ctx, send, recv); err != nil {
					return err
				}
				var want []float32
				for q := range size {
					want = append(want, xs[q][:10]...)
				}
				if got := get[float32](t, devs[r], recv); !slices.Equal(got, want) {
					return fmt.Errorf("rank %d: all-gather %v…, want %v…", r, got[:3], want[:3])
				}
				total := 0
				want = want[:0]
				for q, c := range counts {
					total += c
					want = append(want, xs[q][:c]...)
				}
				sendv := put(t, devs[r], append([]float32{0}, xs[r][:counts[r]]...)).Slice(1, 1+counts[r])
				recvv := put(t, devs[r], make([]float32, total+1)).Slice(0, total)
				if err := comms[r].AllGatherV(ctx, sendv, recvv, counts); err != nil {
					return err
				}
				if got := get[float32](t, devs[r], recvv); !slices.Equal(got, want) {
					return fmt.Errorf("rank %d: all-gather-v differs", r)
				}
				return nil
			})

			// Broadcast from the first and the last rank.
			for _, root := range []int{0, size - 1} {
				onEvery(t, size, func(r int) error {
					b := put(t, devs[r], xs[r])
					if err := comms[r].Broadcast(ctx, b, root); err != nil {
						return err
					}
					if got := get[float32](t, devs[r], b); !slices.Equal(got, xs[root]) {
						return fmt.Errorf("rank %d: broadcast from %d differs", r, root)
					}
					return nil
				})
			}

			// A ring exchange with SendRecv, then Send/Recv pairs, Barrier
			// and a non-blocking all-reduce.
			onEvery(t, size, func(r int) error {
				next, prev := (r+1)%size, (r+size-1)%size
				send := put(t, devs[r], xs[r][:7])
				recv := put(t, devs[r], make([]float32, 7))
				if _, err := comms[r].SendRecv(ctx, send, next, recv, prev, 0); err != nil {
					return err
				}
				if got := get[float32](t, devs[r], recv); !slices.Equal(got, xs[prev][:7]) {
					return fmt.Errorf("rank %d: ring exchange got %v, want %v", r, got, xs[prev][:7])
				}
				if size > 1 {
					switch r {
					case 0:
						if err := comms[r].Send(ctx, send, size-1, 0); err != nil {
							return err
						}
					case size - 1:
						if _, err := comms[r].Recv(ctx, recv, 0, 0); err != nil {
							return err
						}
						if got := get[float32](t, devs[r], recv); !slices.Equal(got, xs[0][:7]) {
							return fmt.Errorf("rank %d: recv got %v", r, got)
						}
					}
				}
				if err := comms[r].Barrier(ctx); err != nil {
					return err
				}
				b := put(t, devs[r], xs[r])
				req, err := comm.IAllReduce(ctx, comms[r], b)
				if err != nil {
					return err
				}
				if n, err := req.Wait(ctx); err != nil || n != b.Len() {
					return fmt.Errorf("rank %d: non-blocking all-reduce: %d, %v", r, n, err)
				}
				if !close32(get[float32](t, devs[r], b), sum) {
					return fmt.Errorf("rank %d: non-blocking all-reduce differs", r)
				}
				return nil
			})

			// Misuse is refused before anything is issued.
			if err := comms[0].AllReduce(ctx, comm.Float32s(make([]float32, 4))); err == nil {
				t.Error("an all-reduce of host memory was accepted")
			}
			if err := comms[0].AllGatherV(ctx, comm.Float32s(nil), comm.Float32s(nil), []int{1}); size > 1 && err == nil {
				t.Error("all-gather-v with one count for several ranks was accepted")
			}
		})
	}
}

// TestNCCLAbortsOnDeadPeer: a rank whose peer never joins the all-reduce
// returns from the call without waiting on the host (the buffer's stream
// waits for the transfer on the device); when the call's context ends, the
// watchdog aborts the communicator, which lets the stream's wait (and the
// host's synchronisation of it) end, and every later call fails at once
// with the abort's error.
func TestNCCLAbortsOnDeadPeer(t *testing.T) {
	sizes := ncclRanks(t)
	if slices.Max(sizes) < 2 {
		t.Skip("needs two GPUs (NCCL puts one rank on each)")
	}
	devs, comms := ncclGroup(t, 2)
	b := put(t, devs[0], make([]float32, 100))
	const deadline = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	start := time.Now()
	before := counts.syncs.Load()
	if err := comms[0].AllReduce(ctx, b); err != nil {
		t.Fatalf("all-reduce issued: %v", err)
	}
	if d, n := time.Since(start), counts.syncs.Load()-before; d >= deadline || n != 0 {
		t.Fatalf("the all-reduce returned after %v and %d host waits, want at once and none", d, n)
	}
	if err := b.Stream.Synchronize(); err != nil {
		t.Logf("the stream after the abort: %v", err)
	}
	if d := time.Since(start); d < deadline || d > 5*time.Second {
		t.Fatalf("the stream behind the transfer was synchronised after %v, want after the deadline (%v) and before 5 s", d, deadline)
	}
	err := comms[0].Broadcast(context.Background(), b, 0)
	if !errors.Is(err, ErrNCCLAborted) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "ncclAllReduce") {
		t.Fatalf("a call after the all-reduce without its peer: %v, want the abort after the all-reduce's deadline", err)
	}
	if err2 := comms[0].Barrier(context.Background()); !errors.Is(err2, ErrNCCLAborted) {
		t.Fatalf("a second call after the abort: %v", err2)
	}
	t.Log(err)
}

// TestNCCLIDPassedByValue checks the calling convention ncclCommInitRank
// is called with (callWithID) against a C function of the same signature
// compiled here: it must see comm, nranks, every byte of the id and rank.
func TestNCCLIDPassedByValue(t *testing.T) {
	if runtime.GOARCH != "amd64" || runtime.GOOS != "linux" {
		t.Skip("the convention is x86-64 System V's")
	}
	gxx, err := exec.LookPath("g++")
	if err != nil {
		t.Fatalf("g++ not found (Debian: apt-get install g++): %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "abi.cpp")
	os.WriteFile(src, []byte(`
struct id128 { unsigned char b[128]; };
extern "C" int init_rank(void** comm, int nranks, id128 id, int rank) {
    unsigned s = 0;
    for (int i = 0; i < 128; i++) s = s * 31 + id.b[i];
    *comm = (void*)(long)(1000 * nranks + rank);
    return (int)(s % 100000);
}
`), 0o644)
	so := filepath.Join(dir, "libabi.so")
	if out, err := testenv.Command(t, 2*time.Minute, gxx, "-shared", "-fPIC", "-O1", "-o", so, src).CombinedOutput(); err != nil {
		t.Fatalf("g++: %v\n%s", err, out)
	}
	h, err := purego.Dlopen(so, purego.RTLD_NOW)
	if err != nil {
		t.Fatal(err)
	}
	fn, err := purego.Dlsym(h, "init_rank")
	if err != nil {
		t.Fatal(err)
	}
	var id NCCLID
	for i := range id {
		id[i] = byte(i*7 + 3)
	}
	var want uint32
	for _, b := range id {
		want = want*31 + uint32(b)
	}
	var comm uintptr
	if got := callWithID(fn, &comm, 5, &id, 3); got != int32(want%100000) || comm != 5003 {
		t.Fatalf("the C side saw checksum %d and comm %d, want %d and 5003", got, comm, want%100000)
	}
}
