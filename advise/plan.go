package advise

import (
	"fmt"
	"math"
	"math/bits"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// Shape is what a method's traffic depends on: the gradient, the worker
// count, the budget and the sizes that depend on the data.
type Shape struct {
	// Sizes are the layout's tensor sizes, in layout order; N their sum.
	Sizes []int
	N     int
	// P is the number of workers.
	P int
	// Density is the setup density ρ; K = sparsify.BudgetK(ρ, N).
	Density float64
	K       int
	// Sel is the number of elements one worker selects per iteration for the
	// methods whose count depends on the data (threshold, micro, deft, dgc,
	// dragonn, oktopk's local selection): what sparsify.Stats.Selected
	// reports (for dragonn including its densely averaged tensors).
	Sel float64
	// Union is the number of distinct indices that cross the wire, |U| (the
	// actual density times N).
	Union float64
	// Params are the method's resolved options (sparsify.Method.Resolve).
	Params sparsify.Values
}

// Call is one kind of communicator call one worker makes per iteration:
// Count calls (a fraction for calls made every few iterations) of Elems
// elements of 4 bytes each, counted as comm.OpStats.Elements counts them
// (the buffer of AllReduce and Broadcast, this worker's contribution to
// AllGather and AllGatherV, the message of Send, Recv and SendRecv).
type Call struct {
	Op    comm.Op
	Count float64
	Elems float64
}

// Plan returns the communicator calls rank 0 of method makes in one
// iteration after any warm-up, as the method's reducer in package sparsify
// makes them (TestPlanMatchesReducers checks it against comm.Counter on the
// real reducers). Non-blocking calls count as their blocking op (comm.Counter
// does the same).
func Plan(method string, s Shape) ([]Call, error) {
	P := float64(s.P)
	K := float64(s.K)
	c := func(op comm.Op, count, elems float64) Call { return Call{op, count, elems} }
	// gatherIndices / sparseExchange: one int32 count per worker, then the lists.
	gather := func(mine float64, lists int) []Call {
		out := []Call{c(comm.OpAllGather, 1, 1)}
		for range lists {
			out = append(out, c(comm.OpAllGatherV, 1, mine))
		}
		return out
	}
	switch method {
	case "dense":
		return []Call{c(comm.OpAllReduce, 1, float64(s.N))}, nil
	case "topk":
		return append(gather(K, 1), c(comm.OpAllReduce, 1, s.Union)), nil
	case "threshold":
		return append(gather(s.Sel, 1), c(comm.OpAllReduce, 1, s.Union)), nil
	case "micro":
		return append(gather(s.Sel, 1), c(comm.OpAllReduce, 1, s.Union)), nil
	case "topka":
		return []Call{c(comm.OpAllGather, 2, K)}, nil
	case "cltk":
		return []Call{c(comm.OpBroadcast, 1, K), c(comm.OpAllReduce, 1, K)}, nil
	case "randomk":
		return []Call{c(comm.OpAllReduce, 1, K)}, nil
	case "gtopk":
		rounds := float64(bits.Len(uint(s.P - 1)))
		if s.P <= 1 {
			rounds = 0
		}
		return []Call{c(comm.OpRecv, 2*rounds, K), c(comm.OpBroadcast, 2, K)}, nil
	case "deft":
		frags := 0
		for _, sz := range s.Sizes {
			if int64(sz)*int64(s.P) > int64(s.N) {
				frags += s.P
			} else {
				frags++
			}
		}
		return append([]Call{c(comm.OpBroadcast, 1, P), c(comm.OpBroadcast, 1, float64(frags))},
			append(gather(s.Sel, 1), c(comm.OpAllReduce, 1, s.Union))...), nil
	case "dgc":
		return gather(s.Sel, 2), nil
	case "dragonn":
		dense, compressed := dragonnSplit(s)
		var out []Call
		if dense > 0 {
			out = append(out, c(comm.OpAllReduce, 1, float64(dense)))
		}
		if compressed > 0 {
			out = append(out, gather(s.Sel-float64(dense), 2)...) // Selected counts the dense tensors too
		}
		return out, nil
	case "lags":
		merge := s.Params.Int("merge_size")
		l, err := layoutOf(s.Sizes)
		if err != nil {
			return nil, err
		}
		var out []Call
		for _, g := range sparsify.LAGSGroups(l, merge) {
			k := min(max(int(float64(g.Size())*s.Density), 1), g.Size())
			out = append(out, c(comm.OpAllGather, 2, float64(k)))
		}
		return out, nil
	case "spardl":
		if G := s.Params.Int("teams"); G != 1 {
			return nil, fmt.Errorf("advise: spardl with %d teams is not modelled; the advisor models teams = 1", G)
		}
		if s.P <= 1 {
			return nil, nil
		}
		C := (s.N + s.P - 1) / s.P
		kb := float64(sparsify.BudgetK(s.Density, C))
		// P−1 reduce-scatter steps and P−1 Bruck transfers, each a length,
		// the indices and the values (SendRecv).
		steps := 2 * (P - 1)
		return []Call{c(comm.OpSendRecv, steps, 1), c(comm.OpSendRecv, 2*steps, kb)}, nil
	case "topkdsa", "oktopk":
		if s.P <= 1 {
			return []Call{c(comm.OpAllGather, 1, 1), c(comm.OpAllGatherV, 1, 2*s.Union)}, nil
		}
		local := K
		if method == "oktopk" {
			local = s.Sel
		}
		// Region exchange: a count and the pairs to and from every peer, in
		// regions of about N/P elements each (the local selection spreads
		// over them).
		pairs := local / P
		out := []Call{
			c(comm.OpSend, P-1, 1), c(comm.OpRecv, P-1, 1),
			c(comm.OpSend, 2*(P-1), pairs), c(comm.OpRecv, 2*(P-1), pairs),
			c(comm.OpAllGather, 1, 1),
		}
		if method == "topkdsa" && 2*s.Union >= float64(2*s.N/3) {
			return append(out, c(comm.OpAllGatherV, 1, float64(s.N)/P)), nil
		}
		// The pairs in one message per owner: its indices, then its values.
		out = append(out, c(comm.OpAllGatherV, 1, 2*s.Union/P))
		if method == "oktopk" {
			out = append(out, c(comm.OpAllReduce, 1.0/64, 2*(P-1))) // P−1 int64 boundaries every 64 calls
		}
		return out, nil
	}
	return nil, fmt.Errorf("advise: no traffic model for method %q", method)
}

// dragonnSplit returns the elements DRAGONN all-reduces densely (tensors of
// at most min_tensor elements) and those it compresses.
func dragonnSplit(s Shape) (dense, compressed int) {
	minT := s.Params.Int("min_tensor")
	for _, sz := range s.Sizes {
		if sz > minT {
			compressed += sz
		} else {
			dense += sz
		}
	}
	return dense, compressed
}

func layoutOf(sizes []int) (sparsify.Layout, error) {
	names := make([]string, len(sizes))
	for i := range names {
		names[i] = fmt.Sprint("t", i)
	}
	return sparsify.NewLayout(names, sizes)
}

// CommTime is the modelled time of one iteration's calls on P workers over
// net. Point-to-point messages are charged on the receiving side only
// (links are full duplex, so a rank's sends overlap its receives): Recv and
// SendRecv cost α + m/β each, one after another; Send costs nothing.
// Collectives cost what netmodel.Network.Cost says, all-gather-v with equal
// contributions.
func CommTime(calls []Call, P int, net netmodel.Network) time.Duration {
	var total float64
	for _, cl := range calls {
		if cl.Count == 0 {
			continue
		}
		b := int64(math.Round(cl.Elems * 4))
		var one time.Duration
		switch cl.Op {
		case comm.OpSend:
			continue
		case comm.OpRecv, comm.OpSendRecv:
			one = net.PointToPoint(b)
		case comm.OpAllGatherV:
			blocks := make([]int64, P)
			for i := range blocks {
				blocks[i] = b
			}
			one = net.AllGatherVTime(blocks)
		default:
			one = net.Cost(cl.Op, P, int(b), 1, nil)
		}
		total += float64(one) * cl.Count
	}
	return time.Duration(total)
}

// Bytes is the number of bytes a worker sends per iteration under the
// calls, on average over the workers (comm.Traffic's accounting, equal
// contributions; a broadcast's root sends more than the others).
func Bytes(calls []Call, P int) float64 {
	var total float64
	for _, cl := range calls {
		e := int(math.Round(cl.Elems))
		if cl.Op == comm.OpSendRecv { // what comm.Counter counts: the message sent
			total += float64(4*e) * cl.Count
			continue
		}
		var counts []int
		if cl.Op == comm.OpAllGatherV || cl.Op == comm.OpReduceScatter {
			counts = make([]int, P)
			for i := range counts {
				counts[i] = e
			}
		}
		var sum float64
		for r := range P {
			sent, _ := comm.Traffic(cl.Op, P, r, e, 4, 0, counts)
			sum += float64(sent)
		}
		total += sum / float64(P) * cl.Count
	}
	return total
}
