package advise

import (
	"slices"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// DDP's bucket sizes: the first bucket closes at 1 MiB of gradient, the
// others at BucketMB (25 MiB, PyTorch DDP's bucket_cap_mb), as the trainer's
// dense (sparsify.DenseFirstBucketMB, DenseDefaultBucketMB).
const (
	FirstBucketMB = sparsify.DenseFirstBucketMB
	BucketMB      = sparsify.DenseDefaultBucketMB
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

// ddpSchedule is DDP's overlapped dense all-reduce of the layout's
// tensors whose gradients become final at ready (seconds after the backward
// pass starts), in the buckets the trainer forms (sparsify.DenseBuckets:
// the tensors in reverse layout order, a bucket closed once it holds firstMB
// MiB, then capMB MiB, or more, as PyTorch DDP closes them), each bucket's
// all-reduce over net among P workers starting when its last tensor is
// final and the previous bucket's all-reduce has ended (one communication
// stream). An all-reduce lasts the longest of its times on net and on
// floors: simulated workers' in-process sums (the host's own collectives,
// Host.hostNet) count towards the emulated network's time, as comm/local
// counts them, so a bucket never ends before the host has summed it.
func ddpSchedule(l layout.Layout, ready []float64, P int, net netmodel.Network, firstMB, capMB float64, floors ...netmodel.Network) []Bucket {
	const mib = 1 << 20
	groups := sparsify.DenseBuckets(l, firstMB*mib, capMB*mib)
	out := make([]Bucket, len(groups))
	var free float64
	for i, g := range groups {
		b := Bucket{Tensors: g.Tensors, Elems: g.Size()}
		for _, t := range g.Tensors {
			b.Ready = max(b.Ready, ready[t])
		}
		b.Start = max(b.Ready, free)
		call := []Call{{Op: comm.OpAllReduce, Count: 1, Elems: float64(b.Elems)}}
		d := CommTime(call, P, net)
		for _, f := range floors {
			d = max(d, CommTime(call, P, f))
		}
		b.End = b.Start + d.Seconds()
		free = b.End
		out[i] = b
	}
	return out
}
