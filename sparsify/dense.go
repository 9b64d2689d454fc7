package sparsify

import (
	"context"
	"fmt"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

// DenseDefaultBucketMB is the default of dense's option bucket_mb, the cap
// of a bucket in MiB (PyTorch DDP's bucket_cap_mb).
const DenseDefaultBucketMB = 25.0

// DenseFirstBucketMB is the cap of dense's first bucket (DDP's first bucket:
// the last layers' gradients start communicating early).
const DenseFirstBucketMB = 1.0

func init() {
	Register(Method{Name: "dense", Projectable: true, Pipelined: true, New: newDense, Advice: denseAdvice,
		Doc: "all-reduce average of acc; residual 0. The gradient is all-reduced in buckets (DenseBuckets: PyTorch DDP's, the first 1 MiB, then at most bucket_mb) in the order the backward pass finishes them, each bucket a view of the flat gradient started as soon as its last tensor is final (overlapped with the backward pass; the trainer's -pipeline off starts them after it) and, in host memory, averaged as soon as its all-reduce completes (DDP's order; on a GPU the averaging is a kernel issued after the backward pass). Each element is summed in the order one all-reduce of the whole gradient sums it (comm.Communicator.IAllReduceView), so the result's bits do not depend on the buckets or on the overlap. No deviation.",
		Params: []options.Option{
			{Key: "bucket_mb", Kind: options.Float, Default: DenseDefaultBucketMB, Range: options.AtLeast(0), Zero: "one bucket, the whole gradient",
				Doc: "cap of a bucket in MiB (DDP's bucket_cap_mb; the first bucket is capped at 1 MiB, as DDP's)"},
		}})
}

// DenseBuckets forms dense's buckets as PyTorch DDP does: it walks the
// tensors of l in reverse (backward) order, adding each to the current
// bucket, and closes the bucket once it holds capBytes or more of float32
// gradient (firstBytes for the first bucket); the last, possibly smaller,
// bucket is kept. A tensor is never split. capBytes <= 0 gives one bucket,
// the whole gradient. The buckets are returned in the order their
// gradients become final during the backward pass.
func DenseBuckets(l Layout, firstBytes, capBytes float64) []Group {
	if capBytes <= 0 {
		return []Group{wholeGroup(l)}
	}
	// A float32 element is 4 bytes: the element counts are exact.
	groups := backwardGroups(l, min(firstBytes, capBytes)/4, capBytes/4)
	// Tensors of no elements at the front (offset 0) may leave an empty
	// bucket; they join the previous one.
	out := groups[:0]
	for _, g := range groups {
		if g.Size() == 0 && len(out) > 0 {
			out[len(out)-1].Tensors = append(out[len(out)-1].Tensors, g.Tensors...)
			out[len(out)-1].Lo = g.Lo
			continue
		}
		out = append(out, g)
	}
	return out
}

// dense is the "dense" baseline: a plain all-reduce average of acc, in
// buckets (DenseBuckets) that the trainer starts during the backward pass.
//
// out = (Σ_w acc_w)/n (each element summed in the communicator's canonical
// order for the whole gradient, then multiplied by 1/n), residual = 0,
// ActualDensity = 1, Selected = N, Threshold = NaN. It conserves the
// gradient exactly up to float32 rounding: Σ_w residual_w + n·out = Σ_w
// acc_w.
type dense struct {
	b       *Env
	buckets []Group
	// averaged, when set (by tests), is called on the goroutine that
	// averaged bucket g in host memory, once it has.
	averaged func(g int)
}

func newDense(e *Env) (Core, error) {
	mb := e.o.Params.Float("bucket_mb")
	const mib = 1 << 20
	return &dense{b: e, buckets: DenseBuckets(e.o.Layout, DenseFirstBucketMB*mib, mb*mib)}, nil
}

// Groups returns the buckets in backward order.
func (r *dense) Groups() []Group { return r.buckets }

// Reduce reduces bucket g: Start, then its finish.
func (r *dense) Reduce(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) error {
	finish, err := r.Start(ctx, g, acc, out, residual, st)
	if err != nil {
		return err
	}
	return finish(ctx)
}

// Start copies bucket g of acc into out, zeroes its residual and starts
// the all-reduce of out's view. In host memory the bucket is averaged (out
// scaled by 1/n) as soon as its all-reduce completes, as DDP divides each
// bucket when its all-reduce is done, on a goroutine of its own: while the
// backward pass goes on, not after it; finish waits for that. On a device
// the stream is one goroutine's (the wait may issue the copy back on it), so
// finish waits and issues the scaling there, after the backward pass: a
// kernel launch on the communication stream, not host work. The same 1/n
// multiplies each element either way: the bits do not depend on where.
func (r *dense) Start(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) (func(context.Context) error, error) {
	b := r.b
	v := &b.v
	gr := r.buckets[g]
	o := out.Slice(gr.Lo, gr.Hi)
	if err := v.s.Copy(o, acc.Slice(gr.Lo, gr.Hi)); err != nil {
		return nil, err
	}
	if err := v.m.Fill(v.s, residual.Slice(gr.Lo, gr.Hi), 0); err != nil {
		return nil, err
	}
	start := time.Now()
	req, err := b.c.IAllReduceView(ctx, v.cb(o), gr.Lo, b.n)
	if err != nil {
		return nil, fmt.Errorf("starting the all-reduce of %d values: %w", o.Len(), err)
	}
	st.Distinct, st.Selected, st.ResidualSq = gr.Size(), gr.Size(), 0
	complete := func(ctx context.Context) error {
		if _, err := req.Wait(ctx); err != nil {
			return fmt.Errorf("all-reducing %d values: %w", o.Len(), err)
		}
		st.CommTime = time.Since(start)
		return v.m.Scale(v.s, o, 1/float32(b.c.Size()))
	}
	if !v.onCPU() {
		return complete, nil
	}
	done := make(chan error, 1)
	go func() {
		err := complete(ctx)
		if r.averaged != nil {
			r.averaged(g)
		}
		done <- err
	}()
	return func(context.Context) error { return <-done }, nil
}

// denseAdvice: one all-reduce per bucket, nothing selected.
var denseAdvice = &Advice{
	// One all-reduce of the whole gradient: the buckets' calls carry the
	// same elements (their α terms are not modelled here).
	Plan: func(s Shape) ([]Call, error) { return []Call{{comm.OpAllReduce, 1, float64(s.N)}}, nil },
	Volume: func(s Shape, _ Overlap) (sel, union float64) {
		return float64(s.N), float64(s.N)
	},
	Selection: NoSelection,
	Evidence:  Evidence{Shown: ModelKinds, Papers: "the baseline: all-reduce of the whole gradient, what data-parallel training does"},
}
