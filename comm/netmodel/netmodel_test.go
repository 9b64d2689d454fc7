package netmodel

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// net1 has round numbers: α = 10 µs, β = 1 GB/s, so 1 MB takes 1 ms.
var net1 = Network{Latency: 10 * time.Microsecond, Bandwidth: 1e9}

const us = time.Microsecond

func TestFormulas(t *testing.T) {
	ring := net1
	ring.AllReduce, ring.AllGather, ring.Broadcast = Ring, Ring, Ring
	lat := net1
	lat.AllReduce, lat.AllGather, lat.Broadcast = RecursiveDoubling, Bruck, BinomialTree
	cases := []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"p2p 1MB", net1.PointToPoint(1e6), 1010 * us},
		{"p2p empty", net1.PointToPoint(0), 10 * us},
		// 2·3·10 µs + 2·3/4 · 4 ms
		{"ring allreduce n4 4MB", net1.AllReduceRing(4, 4e6), 6060 * us},
		// 2·1·10 µs + 2·1/2 · 1 ms
		{"ring allreduce n2 1MB", net1.AllReduceRing(2, 1e6), 1020 * us},
		{"ring allreduce n1", net1.AllReduceRing(1, 1e6), 0},
		// 2 steps of 10 µs + 4 ms
		{"rd allreduce n4 4MB", net1.AllReduceRecursiveDoubling(4, 4e6), 8020 * us},
		// n=5: ⌊log2 5⌋ + 2 = 4 steps of 10 µs + 1 µs
		{"rd allreduce n5 1kB", net1.AllReduceRecursiveDoubling(5, 1000), 44 * us},
		{"rd allreduce n8 1kB", net1.AllReduceRecursiveDoubling(8, 1000), 33 * us},
		{"auto allreduce large is ring", net1.AllReduceTime(4, 4e6), 6060 * us},
		// ring: 60 µs + 1.5 µs; rd: 2·11 µs
		{"auto allreduce small is rd", net1.AllReduceTime(4, 1000), 22 * us},
		// crossover m* = 8αβ = 80 kB: both 180 µs
		{"allreduce crossover ring", ring.AllReduceTime(4, 80_000), 180 * us},
		{"allreduce crossover rd", lat.AllReduceTime(4, 80_000), 180 * us},
		{"fixed ring small", ring.AllReduceTime(4, 1000), 61500 * time.Nanosecond},
		// ring: 3·10 µs + 3·1 ms; Bruck: 2·10 µs + 3 ms
		{"ring allgather n4 1MB", ring.AllGatherTime(4, 1e6), 3030 * us},
		{"bruck allgather n4 1MB", lat.AllGatherTime(4, 1e6), 3020 * us},
		{"auto allgather", net1.AllGatherTime(4, 1e6), 3020 * us},
		// ring: 2 steps, largest block 2 MB
		{"ring allgatherv", net1.AllGatherVRing([]int64{1e6, 2e6, 0}), 4020 * us},
		// Bruck: ⌈log2 3⌉ = 2 rounds, receives 3 MB − 0
		{"bruck allgatherv", net1.AllGatherVBruck([]int64{1e6, 2e6, 0}), 3020 * us},
		{"allgatherv n1", net1.AllGatherVTime([]int64{5}), 0},
		{"reducescatter", net1.ReduceScatterRing([]int64{1e6, 1e6, 1e6, 1e6}), 3030 * us},
		// ⌈log2 5⌉ = 3 hops of 1010 µs
		{"binomial bcast n5", net1.BroadcastBinomial(5, 1e6), 3030 * us},
		// (3 + 4)·10 µs + 2·4/5 · 1 ms
		{"scatter-allgather bcast n5", net1.BroadcastScatterAllGather(5, 1e6), 1670 * us},
		{"auto bcast large", net1.BroadcastTime(5, 1e6), 1670 * us},
		{"auto bcast small", net1.BroadcastTime(5, 10), 30030 * time.Nanosecond},
		{"barrier n16", net1.BarrierTime(16), 40 * us},
		{"barrier n1", net1.BarrierTime(1), 0},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

func TestCost(t *testing.T) {
	cases := []struct {
		name   string
		op     comm.Op
		n      int
		elems  int
		esize  int
		counts []int
		want   time.Duration
	}{
		{"allreduce", comm.OpAllReduce, 4, 1e6, 4, nil, 6060 * us},
		{"allreduce n1", comm.OpAllReduce, 1, 1e6, 4, nil, 0},
		{"allgather", comm.OpAllGather, 4, 250_000, 4, nil, 3020 * us},
		{"allgatherv", comm.OpAllGatherV, 3, 0, 8, []int{125_000, 250_000, 0}, 3020 * us},
		{"reducescatter", comm.OpReduceScatter, 4, 0, 4, []int{250_000, 250_000, 250_000, 250_000}, 3030 * us},
		{"broadcast", comm.OpBroadcast, 5, 250_000, 4, nil, 1670 * us},
		{"send", comm.OpSend, 2, 250_000, 4, nil, 1010 * us},
		{"send n1", comm.OpSend, 1, 250_000, 4, nil, 1010 * us},
		{"recv", comm.OpRecv, 2, 0, 4, nil, 10 * us},
		{"sendrecv", comm.OpSendRecv, 2, 250_000, 4, nil, 1010 * us},
		{"barrier", comm.OpBarrier, 16, 0, 0, nil, 40 * us},
	}
	for _, tc := range cases {
		if got := net1.Cost(tc.op, tc.n, tc.elems, tc.esize, tc.counts); got != tc.want {
			t.Errorf("%s: got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		net  Network
		want string
	}{
		{Network{Latency: -1, Bandwidth: 1}, "negative"},
		{Network{Bandwidth: 0}, "bandwidth"},
		{Network{Bandwidth: -5}, "bandwidth"},
		{Network{Bandwidth: 1, AllReduce: Bruck}, "all-reduce algorithm bruck"},
		{Network{Bandwidth: 1, AllGather: RecursiveDoubling}, "all-gather algorithm"},
		{Network{Bandwidth: 1, Broadcast: Bruck}, "broadcast algorithm"},
	}
	for _, tc := range cases {
		if err := tc.net.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: got %v, want an error containing %q", tc.net, err, tc.want)
		}
	}
	if err := Ethernet10G.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestPayload(t *testing.T) {
	// Byte counts as comm.Traffic produces them, inverted back to payloads.
	st := func(op comm.Op, n, r, calls, elems, esize int, counts []int) comm.OpStats {
		s, rv := comm.Traffic(op, n, r, elems, esize, 0, counts)
		return comm.OpStats{Calls: int64(calls), Elements: int64(calls * elems), BytesSent: int64(calls) * s, BytesRecv: int64(calls) * rv}
	}
	cases := []struct {
		name string
		op   comm.Op
		n    int
		st   comm.OpStats
		want float64
	}{
		{"allreduce float32", comm.OpAllReduce, 4, st(comm.OpAllReduce, 4, 1, 3, 1000, 4, nil), 4000},
		{"allreduce int64", comm.OpAllReduce, 4, st(comm.OpAllReduce, 4, 1, 3, 1000, 8, nil), 8000},
		{"allreduce n1 fallback", comm.OpAllReduce, 1, comm.OpStats{Calls: 2, Elements: 2000}, 4000},
		{"allgather", comm.OpAllGather, 5, st(comm.OpAllGather, 5, 0, 2, 10, 8, nil), 80},
		{"allgatherv equal", comm.OpAllGatherV, 3, st(comm.OpAllGatherV, 3, 0, 1, 7, 4, []int{7, 7, 7}), 28},
		{"reducescatter", comm.OpReduceScatter, 4, st(comm.OpReduceScatter, 4, 2, 1, 40, 4, []int{10, 10, 10, 10}), 160},
		{"send", comm.OpSend, 2, st(comm.OpSend, 2, 0, 4, 25, 4, nil), 100},
		{"recv", comm.OpRecv, 2, st(comm.OpRecv, 2, 0, 4, 25, 8, nil), 200},
		{"no calls", comm.OpAllReduce, 4, comm.OpStats{}, 0},
	}
	for _, tc := range cases {
		if got := Payload(tc.op, tc.n, tc.st); got != tc.want {
			t.Errorf("%s: got %v bytes, want %v", tc.name, got, tc.want)
		}
	}
}

func TestProjectArguments(t *testing.T) {
	if _, err := Project(nil, 0, 4, net1); err == nil {
		t.Fatal("from = 0 accepted")
	}
	if _, err := Project(nil, 2, 4, Network{}); err == nil || !strings.Contains(err.Error(), "bandwidth") {
		t.Fatalf("zero network: got %v", err)
	}
	p, err := Project(map[comm.Op]comm.OpStats{}, 2, 4, net1)
	if err != nil || p.Total != 0 {
		t.Fatalf("empty stats: %v %v", p, err)
	}
}

func TestSleepUntil(t *testing.T) {
	ctx := context.Background()
	for _, d := range []time.Duration{0, 20 * us, 300 * us, 3 * time.Millisecond} {
		start := time.Now()
		if err := SleepUntil(ctx, start.Add(d), nil, nil); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el < d {
			t.Fatalf("SleepUntil(%v) returned after %v", d, el)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := SleepUntil(cctx, time.Now().Add(time.Hour), nil, nil); err == nil {
		t.Fatal("cancelled context ignored")
	}
	abort := make(chan struct{})
	close(abort)
	if err := SleepUntil(ctx, time.Now().Add(time.Hour), abort, func() error { return comm.ErrAborted }); err != comm.ErrAborted {
		t.Fatalf("abort: got %v", err)
	}
}

// TestAllReduceSwitch checks the documented crossover m* = 8αβ for n = 4 on
// Ethernet10G (500 kB): recursive doubling below, ring above.
func TestAllReduceSwitch(t *testing.T) {
	net := Ethernet10G
	for _, tc := range []struct {
		m    int64
		ring bool
	}{{1000, false}, {499_000, false}, {501_000, true}, {10_000_000, true}} {
		got := net.AllReduceTime(4, tc.m)
		want := net.AllReduceRecursiveDoubling(4, tc.m)
		if tc.ring {
			want = net.AllReduceRing(4, tc.m)
		}
		if got != want {
			t.Errorf("m=%d: auto %v, want %v (ring=%v)", tc.m, got, want, tc.ring)
		}
	}
}
