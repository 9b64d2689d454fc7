package comm_test

import (
	"context"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// ringVolume is the plain reference for the per-rank traffic of the ring
// algorithms: it simulates the ring step by step and counts what rank r sends
// and receives. blocks are the block sizes in elements (ChunkBounds chunks for
// all-reduce, counts otherwise).
func ringVolume(op comm.Op, blocks []int, r, esize int) (sent, recv int64) {
	n := len(blocks)
	// In a ring, rank q sends to q+1. reduceScatter: block j starts at rank
	// j+1 and travels to rank j (n−1 hops). allGather: block j starts at its
	// owner j and travels to rank j−1.
	for j, b := range blocks {
		var start int
		switch op {
		case comm.OpReduceScatter:
			start = (j + 1) % n
		case comm.OpAllGather, comm.OpAllGatherV:
			start = j
		}
		for s := 0; s < n-1; s++ {
			from := (start + s) % n
			to := (from + 1) % n
			if from == r {
				sent += int64(b * esize)
			}
			if to == r {
				recv += int64(b * esize)
			}
		}
	}
	return sent, recv
}

func TestTrafficRing(t *testing.T) {
	cases := []struct {
		name   string
		op     comm.Op
		counts []int
		esize  int
	}{
		{"allgatherv n3", comm.OpAllGatherV, []int{1, 2, 3}, 4},
		{"allgatherv n5 zeros", comm.OpAllGatherV, []int{0, 7, 0, 1, 4}, 8},
		{"allgatherv n2", comm.OpAllGatherV, []int{3, 9}, 4},
		{"reducescatter n3", comm.OpReduceScatter, []int{1, 2, 3}, 4},
		{"reducescatter n5", comm.OpReduceScatter, []int{5, 0, 2, 2, 1}, 8},
		{"reducescatter n2", comm.OpReduceScatter, []int{4, 1}, 4},
	}
	for _, tc := range cases {
		n := len(tc.counts)
		for r := range n {
			s, v := comm.Traffic(tc.op, n, r, 0, tc.esize, 0, tc.counts)
			ws, wv := ringVolume(tc.op, tc.counts, r, tc.esize)
			if s != ws || v != wv {
				t.Errorf("%s rank %d: Traffic = (%d, %d), ring simulation (%d, %d)", tc.name, r, s, v, ws, wv)
			}
		}
	}
	// All-gather: blocks of elems each.
	for _, n := range []int{2, 3, 5} {
		blocks := make([]int, n)
		for i := range blocks {
			blocks[i] = 6
		}
		for r := range n {
			s, v := comm.Traffic(comm.OpAllGather, n, r, 6, 4, 0, nil)
			ws, wv := ringVolume(comm.OpAllGather, blocks, r, 4)
			if s != ws || v != wv || s != int64((n-1)*6*4) {
				t.Errorf("allgather n%d rank %d: Traffic = (%d, %d), ring (%d, %d)", n, r, s, v, ws, wv)
			}
		}
	}
}

// TestTrafficAllReduce compares with a reduce-scatter ring followed by an
// all-gather ring over the ChunkBounds chunks. Traffic charges every rank
// 2(L − own chunk) both ways; the simulation matches exactly when the chunks
// are equal, and in total (over ranks) always.
func TestTrafficAllReduce(t *testing.T) {
	for _, tc := range []struct{ n, elems int }{{2, 8}, {4, 8}, {4, 4}, {3, 7}, {5, 11}, {16, 33}, {3, 1}, {4, 0}} {
		blocks := make([]int, tc.n)
		for c := range blocks {
			lo, hi := comm.ChunkBounds(tc.elems, tc.n, c)
			blocks[c] = hi - lo
		}
		even := tc.elems%tc.n == 0
		var ts, tv, ws, wv int64
		for r := range tc.n {
			s, v := comm.Traffic(comm.OpAllReduce, tc.n, r, tc.elems, 4, 0, nil)
			s1, v1 := ringVolume(comm.OpReduceScatter, blocks, r, 4)
			s2, v2 := ringVolume(comm.OpAllGather, blocks, r, 4)
			if even && (s != s1+s2 || v != v1+v2) {
				t.Errorf("n%d L%d rank %d: Traffic (%d, %d), ring (%d, %d)", tc.n, tc.elems, r, s, v, s1+s2, v1+v2)
			}
			ts, tv, ws, wv = ts+s, tv+v, ws+s1+s2, wv+v1+v2
		}
		if ts != ws || tv != wv || ts != int64(2*(tc.n-1)*tc.elems*4) {
			t.Errorf("n%d L%d: totals Traffic (%d, %d), ring (%d, %d), want 2(n−1)L·4 = %d", tc.n, tc.elems, ts, tv, ws, wv, 2*(tc.n-1)*tc.elems*4)
		}
	}
}

func TestTrafficTreeAndP2P(t *testing.T) {
	// Binomial tree on 5 ranks, root 2: relative ranks v = 0..4 are ranks
	// 2, 3, 4, 0, 1; edges v0→v1, v0→v2, v1→v3, v0→v4.
	wantSent := map[int]int64{2: 3 * 40, 3: 40, 4: 0, 0: 0, 1: 0}
	for r := range 5 {
		s, v := comm.Traffic(comm.OpBroadcast, 5, r, 10, 4, 2, nil)
		wv := int64(40)
		if r == 2 {
			wv = 0
		}
		if s != wantSent[r] || v != wv {
			t.Errorf("broadcast rank %d: (%d, %d), want (%d, %d)", r, s, v, wantSent[r], wv)
		}
	}
	cases := []struct {
		name       string
		op         comm.Op
		n, elems   int
		sent, recv int64
	}{
		{"send", comm.OpSend, 4, 10, 40, 0},
		{"recv", comm.OpRecv, 4, 10, 0, 40},
		{"send n1", comm.OpSend, 1, 10, 40, 0},
		{"barrier", comm.OpBarrier, 4, 0, 0, 0},
		{"allreduce n1", comm.OpAllReduce, 1, 10, 0, 0},
		{"allgather n1", comm.OpAllGather, 1, 10, 0, 0},
	}
	for _, tc := range cases {
		if s, v := comm.Traffic(tc.op, tc.n, 0, tc.elems, 4, 0, nil); s != tc.sent || v != tc.recv {
			t.Errorf("%s: (%d, %d), want (%d, %d)", tc.name, s, v, tc.sent, tc.recv)
		}
	}
}

// TestCounter counts a real run on the in-process backend.
func TestCounter(t *testing.T) {
	const n = 3
	counters := make([]*comm.Counter, n)
	err := local.Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
		cnt := comm.NewCounter(c)
		counters[c.Rank()] = cnt
		r := c.Rank()
		for range 2 {
			if err := cnt.AllReduce(ctx, make(comm.Float32s, 7)); err != nil {
				return err
			}
		}
		q, err := cnt.IAllGather(ctx, make(comm.Int64s, 2), make(comm.Int64s, 2*n))
		if err != nil {
			return err
		}
		if _, err := q.Wait(ctx); err != nil {
			return err
		}
		counts := []int{1, 2, 3}
		if err := cnt.AllGatherV(ctx, make(comm.Int32s, counts[r]), make(comm.Int32s, 6), counts); err != nil {
			return err
		}
		if err := cnt.ReduceScatter(ctx, make(comm.Float32s, 6), make(comm.Float32s, counts[r]), counts); err != nil {
			return err
		}
		if err := cnt.Broadcast(ctx, make(comm.Float32s, 10), 1); err != nil {
			return err
		}
		// Rank 0 sends 3 elements to rank 1, which receives into a buffer of 8.
		switch r {
		case 0:
			if err := cnt.Send(ctx, make(comm.Float32s, 3), 1, 0); err != nil {
				return err
			}
		case 1:
			q, err := cnt.IRecv(ctx, make(comm.Float32s, 8), 0, 0)
			if err != nil {
				return err
			}
			if _, err := q.Wait(ctx); err != nil {
				return err
			}
		}
		return cnt.Barrier(ctx)
	})
	if err != nil {
		t.Fatal(err)
	}
	counts := []int{1, 2, 3}
	for r, cnt := range counters {
		check := func(op comm.Op, calls, elems int64, sent, recv int64) {
			t.Helper()
			st := cnt.Stats(op)
			if st.Calls != calls || st.Elements != elems || st.BytesSent != sent || st.BytesRecv != recv {
				t.Errorf("rank %d %v: got calls %d elems %d bytes (%d, %d), want %d %d (%d, %d)", r, op, st.Calls, st.Elements, st.BytesSent, st.BytesRecv, calls, elems, sent, recv)
			}
			if calls > 0 && st.Time <= 0 {
				t.Errorf("rank %d %v: no time recorded", r, op)
			}
		}
		s, v := comm.Traffic(comm.OpAllReduce, n, r, 7, 4, 0, nil)
		check(comm.OpAllReduce, 2, 14, 2*s, 2*v)
		check(comm.OpAllGather, 1, 2, 2*2*8, 2*2*8)
		s, v = comm.Traffic(comm.OpAllGatherV, n, r, 0, 4, 0, counts)
		check(comm.OpAllGatherV, 1, int64(counts[r]), s, v)
		s, v = comm.Traffic(comm.OpReduceScatter, n, r, 0, 4, 0, counts)
		check(comm.OpReduceScatter, 1, 6, s, v)
		s, v = comm.Traffic(comm.OpBroadcast, n, r, 10, 4, 1, nil)
		check(comm.OpBroadcast, 1, 10, s, v)
		switch r {
		case 0:
			check(comm.OpSend, 1, 3, 12, 0)
		case 1:
			check(comm.OpRecv, 1, 3, 0, 12) // the received length, not the buffer's
		}
		check(comm.OpBarrier, 1, 0, 0, 0)
		tot := cnt.Totals()
		var calls, sent int64
		for _, op := range comm.Ops() {
			calls += cnt.Stats(op).Calls
			sent += cnt.Stats(op).BytesSent
		}
		if tot.Calls != calls || tot.BytesSent != sent {
			t.Errorf("rank %d: Totals %+v disagree with the per-op sums (%d calls, %d bytes)", r, tot, calls, sent)
		}
		cnt.Reset()
		if cnt.Totals() != (comm.Totals{}) {
			t.Errorf("rank %d: Reset left %+v", r, cnt.Totals())
		}
	}
}
