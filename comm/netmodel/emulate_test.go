//go:build unix

package netmodel_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/mpi"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// The emulated network of this test: 1 Gbit/s and 50 µs, the slow
// cluster; an all-reduce of 8 MB takes 64 ms on two ranks.
var emuNet = netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: 1e9 / 8}

// slowNet and slowElems: an all-reduce of 1.25 MB that takes 100 ms on two
// ranks, for the overlap check.
var slowNet = netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: 0.1e9 / 8}

const slowElems = 312500

const (
	emuEnv = "SPARSEGRAD_EMULATE_TEST"
	emuOK  = "EMULATE-WORKER-OK"
	// tol is how early a call may end against its modelled end: the ranks
	// leave the emulated barrier at the same modelled instant, give or take
	// the spin's precision and the processes' scheduling.
	tol = 2 * time.Millisecond
)

// emulatedChecks runs on every rank of raw, wraps it with Emulate and
// checks the sums and that each call lasts what the model says: never less
// than its modelled time after the last rank joined; non-blocking calls
// overlap with the caller's work.
func emulatedChecks(ctx context.Context, t *testing.T, raw comm.Communicator) error {
	c, err := netmodel.Emulate(raw, emuNet)
	if err != nil {
		return err
	}
	n, rank := c.Size(), c.Rank()
	const elems = 2 << 20 // 8 MB of float32
	buf := make(comm.Float32s, elems)
	fill := func() {
		for i := range buf {
			buf[i] = float32((i*7+rank*3)%1000 + rank)
		}
	}
	check := func(what string) {
		for _, i := range []int{0, 1, elems/2 + 3, elems - 1} {
			var want float32
			for r := range n {
				want += float32((i*7+r*3)%1000 + r)
			}
			if buf[i] != want {
				t.Errorf("rank %d: %s: element %d is %v, want %v", rank, what, i, buf[i], want)
				return
			}
		}
	}
	cost := emuNet.AllReduceTime(n, 4*elems)
	barrier := func() error { return c.Barrier(ctx) }
	// lastJoin is the latest of the ranks' t0: a rank that left the
	// barrier late (its process was not scheduled) joins late, and the
	// call ends its modelled time after that.
	lastJoin := func(t0 time.Time) (time.Time, error) {
		all := make(comm.Int64s, n)
		if err := c.AllGather(ctx, comm.Int64s{t0.UnixNano()}, all); err != nil {
			return time.Time{}, err
		}
		return time.Unix(0, slices.Max(all)), nil
	}

	// 1. A blocking all-reduce lasts its modelled time (at least: on a
	// loaded machine, or under the race detector, the real call and the
	// scheduler may take longer; check 4 shows the delay is not added
	// twice).
	if err := barrier(); err != nil {
		return err
	}
	fill()
	t0 := time.Now()
	if err := c.AllReduce(ctx, buf); err != nil {
		return err
	}
	end := time.Now()
	d := end.Sub(t0)
	check("AllReduce")
	last, err := lastJoin(t0)
	if err != nil {
		return err
	}
	if end.Sub(last) < cost-tol {
		t.Errorf("rank %d of %d: AllReduce of %d bytes took %v (%v after the last rank joined), the model says %v", rank, n, 4*elems, d, end.Sub(last), cost)
	}

	// 2. It ends its modelled time after the last rank joined.
	const late = 100 * time.Millisecond
	if err := barrier(); err != nil {
		return err
	}
	fill()
	if rank == n-1 {
		time.Sleep(late)
	}
	t0 = time.Now()
	if err := c.AllReduce(ctx, buf); err != nil {
		return err
	}
	end = time.Now()
	check("AllReduce with a late rank")
	if last, err = lastJoin(t0); err != nil {
		return err
	}
	if d := end.Sub(last); d < cost-tol {
		t.Errorf("rank %d of %d: AllReduce ended %v after the last rank (%v late) joined, want at least %v", rank, n, d, late, cost)
	}

	// 3. Two non-blocking all-reduces of views take turns on the wire.
	if err := barrier(); err != nil {
		return err
	}
	fill()
	h := elems / 3
	c1 := emuNet.AllReduceTime(n, 4*int64(h))
	c2 := emuNet.AllReduceTime(n, 4*int64(elems-h))
	t0 = time.Now()
	q1, err := c.IAllReduceView(ctx, buf[:h], 0, elems)
	if err != nil {
		return err
	}
	q2, err := c.IAllReduceView(ctx, buf[h:], h, elems)
	if err != nil {
		return err
	}
	if _, err := q1.Wait(ctx); err != nil {
		return err
	}
	d1 := time.Since(t0)
	if _, err := q2.Wait(ctx); err != nil {
		return err
	}
	d2 := time.Since(t0)
	check("two views")
	if last, err = lastJoin(t0); err != nil {
		return err
	}
	skew := last.Sub(t0)
	if d1-skew < c1-tol || d2-skew < c1+c2-tol {
		t.Errorf("rank %d of %d: views' all-reduces ended after %v and %v, want at least %v and %v (one after the other)", rank, n, d1, d2, c1, c1+c2)
	}

	// 4. A non-blocking all-reduce runs while the caller works: on a
	// slower emulated network, with a buffer whose real all-reduce is
	// quick even on a loaded machine (the emulation only slows calls down).
	slow, err := netmodel.Emulate(raw, slowNet)
	if err != nil {
		return err
	}
	if err := barrier(); err != nil {
		return err
	}
	small := make(comm.Float32s, slowElems)
	for i := range small {
		small[i] = float32(rank + 1)
	}
	scost := slowNet.AllReduceTime(n, 4*slowElems)
	work := scost + 100*time.Millisecond
	t0 = time.Now()
	q, err := comm.IAllReduce(ctx, slow, small)
	if err != nil {
		return err
	}
	time.Sleep(work)
	worked := time.Since(t0)
	if _, err := q.Wait(ctx); err != nil {
		return err
	}
	d = time.Since(t0)
	if want := float32(n * (n + 1) / 2); small[0] != want || small[slowElems-1] != want {
		t.Errorf("rank %d: IAllReduce gave %v … %v, want %v", rank, small[0], small[slowElems-1], want)
	}
	if last, err = lastJoin(t0); err != nil {
		return err
	}
	// Overlapped, the wait after the work (longer than the call) is about
	// nothing; run after the work it would be the call's whole time.
	if want := scost + last.Sub(t0); d < want-tol || d-worked > scost/2 {
		t.Errorf("rank %d of %d: IAllReduce (%v modelled) during %v of work: waited %v after the work, want much less than %v (overlapped)", rank, n, scost, worked, d-worked, scost)
	}

	// 5. Point-to-point: a ring exchange of 1 MB lasts a message's time.
	if err := barrier(); err != nil {
		return err
	}
	send := make(comm.Float32s, 1<<18)
	recv := make(comm.Float32s, 1<<18)
	send[0] = float32(rank)
	p2p := emuNet.PointToPoint(4 << 18)
	t0 = time.Now()
	got, err := c.SendRecv(ctx, send, (rank+1)%n, recv, (rank+n-1)%n, 5)
	if err != nil {
		return err
	}
	d = time.Since(t0)
	if got != len(recv) || recv[0] != float32((rank+n-1)%n) {
		t.Errorf("rank %d: SendRecv received %d elements starting %v, want %d from rank %d", rank, got, recv[0], len(recv), (rank+n-1)%n)
	}
	if d < p2p-tol {
		t.Errorf("rank %d of %d: SendRecv of %d bytes took %v, the model says %v", rank, n, 4<<18, d, p2p)
	}
	// ISend/IRecv and Send/Recv pair up, with the send times in between.
	if rank == 0 {
		q, err := c.ISend(ctx, send, 1, 6)
		if err != nil {
			return err
		}
		if _, err := q.Wait(ctx); err != nil {
			return err
		}
		if _, err := c.Recv(ctx, recv, 1, 7); err != nil {
			return err
		}
	} else if rank == 1 {
		q, err := c.IRecv(ctx, recv, 0, 6)
		if err != nil {
			return err
		}
		if _, err := q.Wait(ctx); err != nil {
			return err
		}
		if err := c.Send(ctx, send, 0, 7); err != nil {
			return err
		}
	}
	return barrier()
}

// TestEmulateInProcess checks Emulate's rule on in-process ranks (comm/local
// without a network of its own), on awkward rank counts.
func TestEmulateInProcess(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			err := local.Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
				e, err := netmodel.Emulate(c, emuNet)
				if err != nil {
					return err
				}
				if n == 1 && e != c {
					t.Errorf("Emulate of one rank is a new communicator; one rank sends nothing")
				}
				if n == 1 {
					return nil
				}
				return emulatedChecks(ctx, t, c)
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
	if _, err := netmodel.Emulate(nil, netmodel.Network{}); err == nil || !strings.Contains(err.Error(), "bandwidth") {
		t.Errorf("Emulate with no bandwidth: %v, want an error naming the bandwidth", err)
	}
}

// TestEmulateUnderMPIRun runs the checks in the processes of a real mpirun
// job: the emulated network is applied between processes.
func TestEmulateUnderMPIRun(t *testing.T) {
	path := testenv.MPIRun(t)
	nps := []int{2, 3}
	if testing.Short() {
		nps = []int{2}
	}
	for _, np := range nps {
		t.Run(fmt.Sprint(np), func(t *testing.T) {
			const limit = 120 * time.Second
			cmd := testenv.Command(t, limit, path, "--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(np),
				os.Args[0], "-test.run=^TestEmulateWorker$", "-test.v", "-test.timeout="+(limit-5*time.Second).String())
			cmd.Env = append(os.Environ(), emuEnv+"=1")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			err := cmd.Run()
			if testenv.PastLimit(cmd) {
				t.Fatalf("mpirun -np %d did not finish within %v; output:\n%s", np, limit, out.String())
			}
			if err != nil || strings.Count(out.String(), emuOK) != np || strings.Contains(out.String(), "--- FAIL") {
				t.Fatalf("mpirun -np %d: %v; output:\n%s", np, err, out.String())
			}
		})
	}
}

// TestEmulateWorker is TestEmulateUnderMPIRun's body in each process.
func TestEmulateWorker(t *testing.T) {
	if os.Getenv(emuEnv) == "" {
		t.Skip("runs only under mpirun, started by TestEmulateUnderMPIRun")
	}
	err := mpi.Run(context.Background(), func(ctx context.Context, c comm.Communicator) error {
		return emulatedChecks(ctx, t, c)
	})
	if err != nil {
		t.Fatal(err)
	}
	if !t.Failed() {
		fmt.Println(emuOK)
	}
}
