package advise

import (
	"cmp"
	"slices"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
)

// DDP's bucket sizes: the first bucket holds at most 1 MB of gradient,
// the others at most BucketMB (25 MB, PyTorch DDP's bucket_cap_mb).
const (
	FirstBucketMB = 1
	BucketMB      = 25
)

// Bucket is one bucket of overlapped dense all-reduce: the tensors it
// holds (layout indices, in the order their gradients became final), its
// elements, when its last tensor became final (Ready) and when its
// all-reduce started and ended, in seconds after the start of the backward
// pass.
type Bucket struct {
	Tensors           []int
	Elems             int
	Ready, Start, End float64
}

// readyTimes returns when each layout tensor's gradient becomes final, in
// seconds after the backward pass starts: h.Ready where it was profiled
// (scaled so that the last is final when the backward pass ends),
// else the backward time spread over the tensors in proportion to their
// sizes, the last tensor of the layout first (the backward pass runs the
// layers in reverse).
func (h *Host) readyTimes() (ready []float64, profiled bool) {
	sizes := h.Layout.Sizes()
	if len(h.Ready) == len(sizes) && len(sizes) > 0 {
		// Profiled where the step was; scaled to the backward pass
		// predicted (-step-time's, a GPU's).
		last := slices.Max(h.Ready)
		if last <= 0 {
			return h.Ready, true
		}
		ready = make([]float64, len(sizes))
		for i, r := range h.Ready {
			ready[i] = r * h.backward() / last
		}
		return ready, true
	}
	ready = make([]float64, len(sizes))
	var done float64
	for i := len(sizes) - 1; i >= 0; i-- {
		done += float64(sizes[i])
		ready[i] = h.backward() * done / float64(max(h.Layout.N, 1))
	}
	return ready, false
}

// backward is the backward pass's time: Backward, or two thirds of
// Compute when the split is unknown.
func (h *Host) backward() float64 {
	if h.Backward > 0 {
		return h.Backward
	}
	return 2 * h.Compute / 3
}

// ddpSchedule is DDP's overlapped dense all-reduce of tensors of the given
// sizes whose gradients become final at ready (seconds after the backward
// pass starts): the tensors in the order they become final (ties: the
// later layout index first) filled into buckets of at most firstMB then
// capMB megabytes (a tensor larger than the cap alone in its bucket),
// each bucket's all-reduce over net among P workers starting when its last
// tensor is final and the previous bucket's all-reduce has ended (one
// communication stream).
func ddpSchedule(sizes []int, ready []float64, P int, net netmodel.Network, firstMB, capMB float64) []Bucket {
	order := make([]int, len(sizes))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		if c := cmp.Compare(ready[a], ready[b]); c != 0 {
			return c
		}
		return cmp.Compare(b, a)
	})
	var out []Bucket
	limit := firstMB * 1e6
	var cur Bucket
	for _, t := range order {
		b := float64(4 * sizes[t])
		if len(cur.Tensors) > 0 && float64(4*cur.Elems)+b > limit {
			out = append(out, cur)
			cur = Bucket{}
			limit = capMB * 1e6
		}
		cur.Tensors = append(cur.Tensors, t)
		cur.Elems += sizes[t]
		cur.Ready = max(cur.Ready, ready[t])
	}
	if len(cur.Tensors) > 0 {
		out = append(out, cur)
	}
	var free float64
	for i := range out {
		out[i].Start = max(out[i].Ready, free)
		out[i].End = out[i].Start + CommTime([]Call{{Op: comm.OpAllReduce, Count: 1, Elems: float64(out[i].Elems)}}, P, net).Seconds()
		free = out[i].End
	}
	return out
}
