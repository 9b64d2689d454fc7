package local

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
)

// slowNet makes costs large compared with the in-process time.
var slowNet = netmodel.Network{Latency: 200 * time.Microsecond, Bandwidth: 1e8}

// TestEmulatedCallsLastTheirModelledTime checks that no emulated call returns
// before its modelled time (a lower bound, which holds on any machine), and
// that results are still correct.
func TestEmulatedCallsLastTheirModelledTime(t *testing.T) {
	const n, m, calls = 3, 30_000, 4
	cases := []struct {
		name string
		cost time.Duration
		call func(ctx context.Context, c comm.Communicator) error
	}{
		{"allreduce", slowNet.Cost(comm.OpAllReduce, n, m, 4, nil), func(ctx context.Context, c comm.Communicator) error {
			b := make(comm.Int32s, m)
			for i := range b {
				b[i] = int32(c.Rank())
			}
			if err := c.AllReduce(ctx, b); err != nil {
				return err
			}
			if b[m-1] != 3 {
				return fmt.Errorf("sum %d, want 3", b[m-1])
			}
			return nil
		}},
		{"allgather", slowNet.Cost(comm.OpAllGather, n, m, 4, nil), func(ctx context.Context, c comm.Communicator) error {
			return c.AllGather(ctx, make(comm.Float32s, m), make(comm.Float32s, n*m))
		}},
		{"iallgather", slowNet.Cost(comm.OpAllGather, n, m, 4, nil), func(ctx context.Context, c comm.Communicator) error {
			q, err := c.IAllGather(ctx, make(comm.Float32s, m), make(comm.Float32s, n*m))
			if err == nil {
				_, err = q.Wait(ctx)
			}
			return err
		}},
		{"sendrecv ring", slowNet.PointToPoint(4 * m), func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			_, err := c.SendRecv(ctx, make(comm.Float32s, m), (r+1)%n, make(comm.Float32s, m), (r+n-1)%n, 0)
			return err
		}},
		{"barrier", slowNet.BarrierTime(n), func(ctx context.Context, c comm.Communicator) error { return c.Barrier(ctx) }},
		{"broadcast", slowNet.BroadcastTime(n, 4*m), func(ctx context.Context, c comm.Communicator) error {
			return c.Broadcast(ctx, make(comm.Int64s, m/2), 2)
		}},
		{"isend irecv ring", slowNet.PointToPoint(4 * m), func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			qr, err := c.IRecv(ctx, make(comm.Int32s, m), (r+n-1)%n, 5)
			if err != nil {
				return err
			}
			qs, err := c.ISend(ctx, make(comm.Int32s, m), (r+1)%n, 5)
			if err != nil {
				return err
			}
			if _, err := qs.Wait(ctx); err != nil {
				return err
			}
			_, err = qr.Wait(ctx)
			return err
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
				for range calls {
					if err := tc.call(ctx, c); err != nil {
						return err
					}
				}
				return nil
			}, WithNetwork(slowNet))
			if err != nil {
				t.Fatal(err)
			}
			if el := time.Since(start); el < calls*tc.cost {
				t.Fatalf("%d calls took %v, less than the modelled %d × %v", calls, el, calls, tc.cost)
			}
		})
	}
}

// TestEmulatedOverlap checks that a non-blocking call's modelled delay
// elapses in the background while the rank works: the time each rank spends
// inside its communication calls (starting the all-reduce and waiting for
// it) must stay well below the modelled time (under half of it) when the
// work lasts longer than the delay, whereas a delay applied inside the call,
// or counted from Wait on, makes it at least the modelled time. Only the
// time inside the calls is judged, not the run's total, so a loaded machine
// that stretches the work (the "descheduled" case stretches it on purpose)
// cannot fail the test, and the margin is half the modelled time instead of
// a few milliseconds of the whole run.
func TestEmulatedOverlap(t *testing.T) {
	net := netmodel.Network{Latency: 100 * time.Millisecond, Bandwidth: 1e9}
	cost := net.Cost(comm.OpAllReduce, 2, 10, 4, nil) // one α: 100 ms
	for _, tc := range []struct {
		name  string
		stall time.Duration // extra time the work takes, as on a loaded machine
	}{
		{"work longer than the delay", 0},
		{"descheduled during the work", 150 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inCalls := make([]time.Duration, 2)
			start := time.Now()
			err := Run(testCtx(t), 2, func(ctx context.Context, c comm.Communicator) error {
				t0 := time.Now()
				q, err := comm.IAllReduce(ctx, c, make(comm.Float32s, 10))
				if err != nil {
					return err
				}
				started := time.Since(t0)
				time.Sleep(2*cost + tc.stall) // the "backward pass"
				t1 := time.Now()
				_, err = q.Wait(ctx)
				inCalls[c.Rank()] = started + time.Since(t1)
				return err
			}, WithNetwork(net))
			if err != nil {
				t.Fatal(err)
			}
			if el := time.Since(start); el < cost {
				t.Fatalf("returned after %v, before the modelled %v", el, cost)
			}
			for r, d := range inCalls {
				if d >= cost/2 {
					t.Errorf("rank %d spent %v in IAllReduce and Wait: the modelled %v did not elapse during the %v of work", r, d, cost, 2*cost+tc.stall)
				}
			}
		})
	}
}

// TestEmulatedCollectivesTakeTurns: collectives in flight at once share
// the emulated link: k all-reduces started together (the buckets of dense
// overlapped with the backward pass) end no earlier than k modelled times
// after the start (a lower bound, which holds on any machine), and each
// later one no earlier than its predecessor's cost after it.
func TestEmulatedCollectivesTakeTurns(t *testing.T) {
	net := netmodel.Network{Latency: 20 * time.Millisecond, Bandwidth: 1e9}
	const k, m = 4, 1000
	cost := net.Cost(comm.OpAllReduce, 3, m, 4, nil)
	for _, n := range []int{1, 3} {
		ends := make([][]time.Duration, n)
		start := time.Now()
		err := Run(testCtx(t), n, func(ctx context.Context, c comm.Communicator) error {
			buf := make(comm.Float32s, k*m)
			var qs []comm.Request
			for i := range k {
				q, err := c.IAllReduceView(ctx, buf.Slice(i*m, (i+1)*m), i*m, k*m)
				if err != nil {
					return err
				}
				qs = append(qs, q)
			}
			for _, q := range qs {
				if _, err := q.Wait(ctx); err != nil {
					return err
				}
				ends[c.Rank()] = append(ends[c.Rank()], time.Since(start))
			}
			return nil
		}, WithNetwork(net))
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			continue // one rank sends nothing: no cost
		}
		for r := range ends {
			for i, e := range ends[r] {
				if want := time.Duration(i+1) * cost; e < want {
					t.Errorf("%d ranks: rank %d: all-reduce %d of %d ended after %v, before the %v of %d turns on the link", n, r, i+1, k, e, want, i+1)
				}
			}
		}
	}
}

func TestWithNetworkInvalid(t *testing.T) {
	err := Run(context.Background(), 2, func(context.Context, comm.Communicator) error { return nil }, WithNetwork(netmodel.Network{}))
	if err == nil {
		t.Fatal("zero-bandwidth network accepted")
	}
}

// TestEmulatedAbort checks that a long emulated delay is cut short by a
// failing rank.
func TestEmulatedAbort(t *testing.T) {
	net := netmodel.Network{Latency: time.Hour, Bandwidth: 1e9}
	start := time.Now()
	err := Run(testCtx(t), 2, func(ctx context.Context, c comm.Communicator) error {
		if c.Rank() == 1 {
			time.Sleep(20 * time.Millisecond)
			return fmt.Errorf("rank 1 gives up")
		}
		return c.Send(ctx, comm.Float32s{1}, 1, 0)
	}, WithNetwork(net))
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("got %v after %v", err, time.Since(start))
	}
}

// BenchmarkEmulatedDelay measures how close emulated calls come to their
// modelled time on a 10 Gbit/s, 50 µs network (two ranks, and four for
// allreduce-n4). Metrics: model-µs;
// median-µs and mean-µs, the median and mean duration of one call on rank 0;
// err-%, the median's deviation from the model. The median is reported
// because on a shared machine a few calls are stretched by the operating
// system descheduling the process, which no in-process emulation can prevent.
func BenchmarkEmulatedDelay(b *testing.B) {
	net := netmodel.Ethernet10G
	for _, op := range []string{"allreduce", "sendrecv", "allreduce-n4"} {
		for _, bytes := range []int{1 << 10, 10 << 10, 100 << 10, 1 << 20, 10 << 20, 100 << 20} {
			m := bytes / 4
			n := 2
			if op == "allreduce-n4" {
				n = 4
			}
			b.Run(fmt.Sprintf("%s/%dKiB", op, bytes>>10), func(b *testing.B) {
				var model time.Duration
				durs := make([]time.Duration, 0, b.N)
				err := Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
					buf := make(comm.Float32s, m)
					recv := make(comm.Float32s, m)
					for i := range buf { // fault the pages in before timing
						buf[i], recv[i] = 1, 1
					}
					r := c.Rank()
					for range b.N {
						if err := c.Barrier(ctx); err != nil {
							return err
						}
						start := time.Now()
						var err error
						if op != "sendrecv" {
							err = c.AllReduce(ctx, buf)
						} else {
							_, err = c.SendRecv(ctx, buf, 1-r, recv, 1-r, 0)
						}
						if err != nil {
							return err
						}
						if r == 0 {
							durs = append(durs, time.Since(start))
						}
					}
					if r == 0 {
						if op != "sendrecv" {
							model = net.Cost(comm.OpAllReduce, n, m, 4, nil)
						} else {
							model = net.PointToPoint(int64(bytes))
						}
					}
					return nil
				}, WithNetwork(net))
				if err != nil {
					b.Fatal(err)
				}
				var sum time.Duration
				for _, d := range durs {
					sum += d
				}
				slices.Sort(durs)
				med := durs[len(durs)/2]
				b.ReportMetric(float64(model)/1e3, "model-µs")
				b.ReportMetric(float64(med)/1e3, "median-µs")
				b.ReportMetric(float64(sum)/float64(len(durs))/1e3, "mean-µs")
				b.ReportMetric(100*(float64(med)-float64(model))/float64(model), "err-%")
			})
		}
	}
}
