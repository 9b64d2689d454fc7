package comm_test

import (
	"context"
	"reflect"
	"slices"
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
// all-gather ring over the ChunkBounds chunks, rank by rank, for equal and
// uneven chunks (L not a multiple of n, L < n, L = 0), and in total (over
// ranks) with 2(n−1)L.
func TestTrafficAllReduce(t *testing.T) {
	for _, tc := range []struct{ n, elems int }{
		{2, 8}, {4, 8}, {4, 4}, // equal chunks
		{3, 7}, {5, 11}, {16, 33}, {2, 3}, {4, 6}, {7, 100}, {16, 255}, // uneven chunks
		{3, 1}, {5, 2}, {16, 15}, {4, 0}, // fewer elements than ranks
	} {
		blocks := make([]int, tc.n)
		for c := range blocks {
			lo, hi := comm.ChunkBounds(tc.elems, tc.n, c)
			blocks[c] = hi - lo
		}
		var ts, tv, ws, wv int64
		for r := range tc.n {
			s, v := comm.Traffic(comm.OpAllReduce, tc.n, r, tc.elems, 4, 0, nil)
			s1, v1 := ringVolume(comm.OpReduceScatter, blocks, r, 4)
			s2, v2 := ringVolume(comm.OpAllGather, blocks, r, 4)
			if s != s1+s2 || v != v1+v2 {
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

// TestCounterBackendErrorNotCounted: a call the backend refuses (here counts
// of the wrong length, which comm.Traffic cannot price) returns the backend's
// error and is not counted; it must not panic.
func TestCounterBackendErrorNotCounted(t *testing.T) {
	const n = 3
	cases := []struct {
		name string
		call func(ctx context.Context, c *comm.Counter) error
	}{
		{"allgatherv short counts", func(ctx context.Context, c *comm.Counter) error {
			return c.AllGatherV(ctx, make(comm.Float32s, 1), make(comm.Float32s, 1), []int{1})
		}},
		{"allgather wrong recv length", func(ctx context.Context, c *comm.Counter) error {
			return c.AllGather(ctx, make(comm.Float32s, 2), make(comm.Float32s, 1))
		}},
		{"send to a rank that does not exist", func(ctx context.Context, c *comm.Counter) error {
			return c.Send(ctx, make(comm.Float32s, 2), n+4, 0)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := local.New(n)
			cnt := comm.NewCounter(w.Comm(0))
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						t.Fatalf("panicked instead of returning the backend's error: %v", p)
					}
				}()
				err = tc.call(context.Background(), cnt)
			}()
			if err == nil {
				t.Fatal("no error for a call the backend must refuse")
			}
			if tot := cnt.Totals(); tot != (comm.Totals{}) {
				t.Errorf("failed call was counted: %+v", tot)
			}
		})
	}
}

// TestTrafficCountsShorterThanRanks: Traffic prices malformed counts (fewer
// entries than ranks) without panicking, missing entries counting as 0.
func TestTrafficCountsShorterThanRanks(t *testing.T) {
	for _, op := range []comm.Op{comm.OpAllGatherV, comm.OpReduceScatter} {
		for _, counts := range [][]int{nil, {5}, {1, 2}} {
			for r := range 3 {
				s, v := comm.Traffic(op, 3, r, 0, 4, 0, counts)
				full := append(append([]int(nil), counts...), make([]int, 3-len(counts))...)
				ws, wv := comm.Traffic(op, 3, r, 0, 4, 0, full)
				if s != ws || v != wv {
					t.Errorf("%v counts %v rank %d: (%d, %d), want (%d, %d) as with %v", op, counts, r, s, v, ws, wv, full)
				}
			}
		}
	}
}

// fakeComm is a one-rank Communicator that records the names of the methods
// called and succeeds at everything.
type fakeComm struct{ calls []string }

type fakeReq struct{ n int }

func (q fakeReq) Wait(context.Context) (int, error) { return q.n, nil }

func (f *fakeComm) Rank() int { f.calls = append(f.calls, "Rank"); return 0 }
func (f *fakeComm) Size() int { f.calls = append(f.calls, "Size"); return 1 }
func (f *fakeComm) AllReduce(context.Context, comm.Buffer) error {
	f.calls = append(f.calls, "AllReduce")
	return nil
}
func (f *fakeComm) AllGather(context.Context, comm.Buffer, comm.Buffer) error {
	f.calls = append(f.calls, "AllGather")
	return nil
}
func (f *fakeComm) AllGatherV(context.Context, comm.Buffer, comm.Buffer, []int) error {
	f.calls = append(f.calls, "AllGatherV")
	return nil
}
func (f *fakeComm) Broadcast(context.Context, comm.Buffer, int) error {
	f.calls = append(f.calls, "Broadcast")
	return nil
}
func (f *fakeComm) Send(context.Context, comm.Buffer, int, int) error {
	f.calls = append(f.calls, "Send")
	return nil
}
func (f *fakeComm) Recv(_ context.Context, b comm.Buffer, _, _ int) (int, error) {
	f.calls = append(f.calls, "Recv")
	return b.Len(), nil
}
func (f *fakeComm) SendRecv(_ context.Context, _ comm.Buffer, _ int, b comm.Buffer, _, _ int) (int, error) {
	f.calls = append(f.calls, "SendRecv")
	return b.Len(), nil
}
func (f *fakeComm) Barrier(context.Context) error { f.calls = append(f.calls, "Barrier"); return nil }
func (f *fakeComm) IAllReduceView(_ context.Context, b comm.Buffer, _, _ int) (comm.Request, error) {
	f.calls = append(f.calls, "IAllReduceView")
	return fakeReq{b.Len()}, nil
}
func (f *fakeComm) IAllGather(_ context.Context, _, b comm.Buffer) (comm.Request, error) {
	f.calls = append(f.calls, "IAllGather")
	return fakeReq{b.Len()}, nil
}
func (f *fakeComm) ISend(_ context.Context, b comm.Buffer, _, _ int) (comm.Request, error) {
	f.calls = append(f.calls, "ISend")
	return fakeReq{b.Len()}, nil
}
func (f *fakeComm) IRecv(_ context.Context, b comm.Buffer, _, _ int) (comm.Request, error) {
	f.calls = append(f.calls, "IRecv")
	return fakeReq{b.Len()}, nil
}

// TestCounterCountsEveryMethod calls every method of the Communicator
// interface, found by reflection, on a Counter and checks that the call
// reached the backend and was counted under its Op. A method added to the
// interface fails here until it is added to the table below (and forwarded
// and counted by Counter).
func TestCounterCountsEveryMethod(t *testing.T) {
	// The Op each method is counted under; Rank and Size are not calls.
	want := map[string]comm.Op{
		"AllReduce": comm.OpAllReduce, "IAllReduceView": comm.OpAllReduce,
		"AllGather": comm.OpAllGather, "IAllGather": comm.OpAllGather,
		"AllGatherV": comm.OpAllGatherV,
		"Broadcast":  comm.OpBroadcast,
		"Send":       comm.OpSend, "ISend": comm.OpSend,
		"Recv": comm.OpRecv, "IRecv": comm.OpRecv,
		"SendRecv": comm.OpSendRecv,
		"Barrier":  comm.OpBarrier,
	}
	notCalls := map[string]bool{"Rank": true, "Size": true}

	// Counter must not embed the interface: an embedded interface forwards
	// a method added later without counting it.
	ct := reflect.TypeOf(comm.Counter{})
	for i := range ct.NumField() {
		if f := ct.Field(i); f.Anonymous {
			t.Errorf("Counter embeds %s: forward every method explicitly instead", f.Type)
		}
	}

	ctx := context.Background()
	iface := reflect.TypeOf((*comm.Communicator)(nil)).Elem()
	for i := range iface.NumMethod() {
		m := iface.Method(i)
		t.Run(m.Name, func(t *testing.T) {
			fake := &fakeComm{}
			cnt := comm.NewCounter(fake)
			args := make([]reflect.Value, m.Type.NumIn())
			for j := range args {
				switch in := m.Type.In(j); in {
				case reflect.TypeOf((*context.Context)(nil)).Elem():
					args[j] = reflect.ValueOf(ctx)
				case reflect.TypeOf((*comm.Buffer)(nil)).Elem():
					args[j] = reflect.ValueOf(comm.Buffer(make(comm.Float32s, 2)))
				case reflect.TypeOf(0):
					args[j] = reflect.ValueOf(0)
				case reflect.TypeOf([]int(nil)):
					args[j] = reflect.ValueOf([]int{2})
				default:
					t.Fatalf("parameter %d of %s has type %s, which this test cannot fill: extend it", j, m.Name, in)
				}
			}
			res := reflect.ValueOf(cnt).MethodByName(m.Name).Call(args)
			if !slices.Contains(fake.calls, m.Name) {
				t.Fatalf("Counter.%s did not reach the backend's %s (it called %v)", m.Name, m.Name, fake.calls)
			}
			for _, r := range res {
				if q, ok := r.Interface().(comm.Request); ok && q != nil {
					if _, err := q.Wait(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if err, ok := r.Interface().(error); ok && err != nil {
					t.Fatal(err)
				}
			}
			if notCalls[m.Name] {
				if tot := cnt.Totals(); tot.Calls != 0 {
					t.Errorf("%s counted as a call", m.Name)
				}
				return
			}
			op, ok := want[m.Name]
			if !ok {
				t.Fatalf("interface method %s is not in this test's table: decide under which Op Counter counts it", m.Name)
			}
			if got := cnt.Stats(op).Calls; got != 1 {
				t.Errorf("%s: %d calls counted under %v, want 1", m.Name, got, op)
			}
			if tot := cnt.Totals(); tot.Calls != 1 {
				t.Errorf("%s: %d calls counted in all, want 1", m.Name, tot.Calls)
			}
		})
	}
}
