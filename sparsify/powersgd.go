package sparsify

import (
	"context"
	_ "embed"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/options"
)

func init() {
	Register(Method{Name: "powersgd", Projectable: true, New: newPowerSGD, Advice: powersgdAdvice, Kernels: []*device.Kernel{psgdKernel},
		Params: []options.Option{
			{Key: "rank", Kind: options.Int, Default: 1, Range: options.Within(1, 1<<16, "[]"),
				Doc: "PowerSGD's approximation rank r (PyTorch's powerSGD_hook's default, 1)"},
		},
		Doc: "reference notes 11.2: PowerSGD (Vogels, Karimireddy and Jaggi, 2019; epfml/powersgd and PyTorch's powerSGD_hook): each tensor of more than one dimension as the matrix (shape[0], rest), one power-iteration step of rank r warm-started from the previous Q (the same seeded Gaussian start on every worker): P = MQ all-reduced, orthogonalized by Gram–Schmidt, Q = MᵀP all-reduced and averaged, out = PQᵀ, residual = acc − PQᵀ; 1-D tensors, and matrices the hook leaves uncompressed ((rows+cols)·r·2 >= rows·cols), all-reduced dense with the P's. Deviations: no dense warm-up (the hook's start_powerSGD_iter; epfml's code has none); a tensor of unknown shape is taken as the most nearly square matrix of its size; products accumulated in float64 (in index order, rounded once: on a GPU its kernel gives the same bits, where cuBLAS's float32 sums would not)."})
}

// powersgd is "powersgd", PowerSGD (Vogels, Karimireddy and Jaggi,
// NeurIPS 2019, Algorithm 1, as epfml/powersgd and PyTorch's
// powerSGD_hook implement it), rank r (option rank):
//
//   - Which tensors: a tensor of the layout with Dims() >= 2 is the
//     row-major matrix M of shape[0] rows and size/shape[0] columns (the
//     hook's view); one of unknown shape (Dims() 0) the matrix of rows·cols
//     = size with rows the largest divisor of size at most √size. It is
//     compressed, with rank min(r, rows, cols), when (rows+cols)·rank·2 <
//     rows·cols (the hook's min_compression_rate 2); 1-D tensors and the
//     others are all-reduced dense (out = sum·(1/n), residual 0).
//   - Q (cols×rank) starts as standard normal values drawn from
//     Options.Seed and the tensor's index (the same on every worker) and is
//     kept between calls (warm start, in checkpoints).
//   - P = MQ for every compressed tensor; one AllReduce of every P and the
//     dense tensors (P summed); each P orthogonalized by Gram–Schmidt,
//     column by column (col /= ‖col‖ + 1e-8, then removed from the later
//     columns, as epfml's orthogonalize); Q = MᵀP; one AllReduce of every
//     Q, times 1/n; out = PQᵀ, residual = acc − PQᵀ.
//
// Products are accumulated in float64 and rounded to float32. It conserves
// the gradient (residual = acc − out). Stats: Selected = Distinct = N,
// Threshold = NaN.
type powersgd struct {
	b     *Env
	mats  []psgdMat
	dense []int
	np    int // elements of the first all-reduce: the P's and the dense tensors
	nq    int
	// Every Q, concatenated (the state): q holds them on the host until
	// load uploads them to dQ, the worker's device's copy.
	q      []float32
	load   bool
	dP, dQ device.Buffer
}

// psgdMat is a compressed tensor: its layout index, its matrix shape and
// rank, and the offsets of its P and Q in the buffers.
type psgdMat struct {
	t, rows, cols, r int
	po, qo           int
}

// psgdShape is the matrix PowerSGD makes of a tensor, and whether it
// compresses it with rank r (the rank it uses: min(r, rows, cols)).
func psgdShape(tn Tensor, r int) (rows, cols, rank int, ok bool) {
	switch {
	case tn.Dims() == 1:
		return 0, 0, 0, false
	case tn.Dims() >= 2:
		rows = tn.Shape[0]
	default:
		rows = 1
		for d := 1; d*d <= tn.Size; d++ {
			if tn.Size%d == 0 {
				rows = d
			}
		}
	}
	if rows <= 0 {
		return 0, 0, 0, false
	}
	cols = tn.Size / rows
	rank = min(r, rows, cols)
	return rows, cols, rank, (rows+cols)*rank*2 < rows*cols
}

func newPowerSGD(e *Env) (Core, error) {
	r := &powersgd{b: e, load: true}
	rank := e.o.Params.Int("rank")
	for t, tn := range e.o.Layout.Tensors {
		rows, cols, k, ok := psgdShape(tn, rank)
		if !ok {
			r.dense = append(r.dense, t)
			continue
		}
		if rows*cols > math.MaxInt32 || max(rows, cols)*k > math.MaxInt32 {
			return nil, fmt.Errorf("tensor %s: a %d×%d matrix is too large for PowerSGD's int32 shapes", tn.Name, rows, cols)
		}
		r.mats = append(r.mats, psgdMat{t: t, rows: rows, cols: cols, r: k, po: r.np, qo: r.nq})
		r.np += rows * k
		r.nq += cols * k
	}
	for _, t := range r.dense {
		r.np += e.o.Layout.Tensors[t].Size
	}
	r.q = make([]float32, r.nq)
	for _, m := range r.mats {
		rng := rand.New(rand.NewPCG(e.o.Seed, uint64(m.t)<<8|0x9c))
		q := r.q[m.qo : m.qo+m.cols*m.r]
		for j := range q {
			q[j] = float32(rng.NormFloat64())
		}
	}
	return r, nil
}

// Reduce runs one power-iteration step per compressed tensor, in the
// worker's device memory (psgdKernel).
func (r *powersgd) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	lay := b.o.Layout.Tensors
	inv := 1 / float32(b.c.Size())
	st.Selected, st.Distinct = b.n, b.n
	var err error
	if r.dP, err = v.scratch(&r.dP, device.Float32, max(r.np, 1)); err != nil {
		return err
	}
	if r.dQ, err = v.scratch(&r.dQ, device.Float32, max(r.nq, 1)); err != nil {
		return err
	}
	if r.load {
		if r.nq > 0 {
			if err := v.s.Copy(r.dQ.Slice(0, r.nq), device.Host(r.q)); err != nil {
				return fmt.Errorf("copying Q to the device: %w", err)
			}
			if err := v.s.Synchronize(); err != nil { // r.q may change (LoadState)
				return err
			}
		}
		r.load = false
	}
	none := device.Buffer{}
	run := func(mode int32, n int, M, P, Q, out, res device.Buffer, m psgdMat) error {
		return v.ops.Run(v.s, psgdKernel, n, M, P, Q, out, res, int64(n), int32(m.rows), int32(m.cols), int32(m.r), inv, mode)
	}
	mat := func(m psgdMat) (M, P, Q device.Buffer) {
		off := lay[m.t].Offset
		return acc.Slice(off, off+m.rows*m.cols), r.dP.Slice(m.po, m.po+m.rows*m.r), r.dQ.Slice(m.qo, m.qo+m.cols*m.r)
	}
	// P = MQ, then the dense tensors after the P's.
	selTime, err := b.selectTimed(func() error {
		for _, m := range r.mats {
			M, P, Q := mat(m)
			if err := run(0, m.rows*m.r, M, P, Q, none, none, m); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	j := r.np
	for i := len(r.dense) - 1; i >= 0; i-- {
		tn := lay[r.dense[i]]
		j -= tn.Size
		if err := v.s.Copy(r.dP.Slice(j, j+tn.Size), acc.Slice(tn.Offset, tn.Offset+tn.Size)); err != nil {
			return err
		}
	}
	if r.np > 0 {
		if err := b.c.AllReduce(ctx, v.cb(r.dP.Slice(0, r.np))); err != nil {
			return fmt.Errorf("all-reducing %d elements of P and uncompressed tensors: %w", r.np, err)
		}
	}
	for _, t := range r.dense {
		tn := lay[t]
		lo, hi := tn.Offset, tn.Offset+tn.Size
		if err := run(4, tn.Size, r.dP.Slice(j, j+tn.Size), none, none, out.Slice(lo, hi), residual.Slice(lo, hi), psgdMat{}); err != nil {
			return err
		}
		j += tn.Size
	}
	// Orthogonalize each P; Q = MᵀP.
	for _, m := range r.mats {
		M, P, Q := mat(m)
		if err := run(1, 1, M, P, Q, none, none, m); err != nil {
			return err
		}
		if err := run(2, m.cols*m.r, M, P, Q, none, none, m); err != nil {
			return err
		}
	}
	if r.nq > 0 {
		if err := b.c.AllReduce(ctx, v.cb(r.dQ.Slice(0, r.nq))); err != nil {
			return fmt.Errorf("all-reducing %d elements of Q: %w", r.nq, err)
		}
		if err := run(5, r.nq, none, none, r.dQ.Slice(0, r.nq), none, none, psgdMat{}); err != nil {
			return err
		}
	}
	// out = PQᵀ; residual = acc − out (acc may be residual's memory).
	for _, m := range r.mats {
		M, P, Q := mat(m)
		off := lay[m.t].Offset
		n := m.rows * m.cols
		if err := run(3, n, M, P, Q, out.Slice(off, off+n), residual.Slice(off, off+n), m); err != nil {
			return err
		}
	}
	st.SelectTime = selTime
	return nil
}

//go:embed powersgd.cu
var psgdCUDA string

// psgdKernel is PowerSGD's passes over one matrix (powersgd.cu's k_psgd;
// arguments M, P, Q, out, res, n as int64, rows, cols and r as int32, inv
// as float32, mode as int32; the file says what each mode does).
var psgdKernel = &device.Kernel{Name: "k_psgd", CUDA: psgdCUDA, Host: func(n int, a ...any) {
	f := func(i int) []float32 { return a[i].(device.Buffer).Float32s() }
	rows, cols, r, inv := int(a[6].(int32)), int(a[7].(int32)), int(a[8].(int32)), a[9].(float32)
	switch a[10].(int32) {
	case 0:
		M, P, Q := f(0), f(1), f(2)
		selParallel(n, selChunks(n), func(_, lo, hi int) {
			for e := lo; e < hi; e++ {
				i, c := e/r, e%r
				var s float64
				for j, x := range M[i*cols : (i+1)*cols] {
					s += float64(x) * float64(Q[j*r+c]) // exact: no rounding to fuse
				}
				P[e] = float32(s)
			}
		})
	case 1:
		psgdOrthogonalize(f(1), rows, r)
	case 2:
		M, P, Q := f(0), f(1), f(2)
		selParallel(n, selChunks(n), func(_, lo, hi int) {
			for e := lo; e < hi; e++ {
				j, c := e/r, e%r
				var s float64
				for i := range rows {
					s += float64(M[i*cols+j]) * float64(P[i*r+c])
				}
				Q[e] = float32(s)
			}
		})
	case 3:
		M, P, Q, out, res := f(0), f(1), f(2), f(3), f(4)
		selParallel(n, selChunks(n), func(_, lo, hi int) {
			for e := lo; e < hi; e++ {
				i, j := e/cols, e%cols
				var s float64
				for c := range r {
					s += float64(P[i*r+c]) * float64(Q[j*r+c])
				}
				o := float32(s)
				out[e], res[e] = o, M[e]-o
			}
		})
	case 4:
		M, out, res := f(0), f(3), f(4)
		for e := range n {
			out[e], res[e] = M[e]*inv, 0
		}
	case 5:
		Q := f(2)
		for e := range n {
			Q[e] *= inv
		}
	}
}}

// psgdOrthogonalize orthogonalizes the r columns of the rows×r row-major
// matrix P by Gram–Schmidt, as epfml/powersgd's orthogonalize: each column
// divided by its norm + 1e-8, then its projection removed from the later
// columns (sums in float64).
func psgdOrthogonalize(P []float32, rows, r int) {
	for c := range r {
		var s float64
		for i := range rows {
			x := float64(P[i*r+c])
			s += x * x
		}
		d := float32(math.Sqrt(s)) + 1e-8
		for i := range rows {
			P[i*r+c] /= d
		}
		for c2 := c + 1; c2 < r; c2++ {
			var dot float64
			for i := range rows {
				dot += float64(P[i*r+c]) * float64(P[i*r+c2])
			}
			fd := float32(dot)
			for i := range rows {
				P[i*r+c2] -= float32(fd * P[i*r+c]) // the product rounded: no fused multiply-add (the GPU's --fmad=false)
			}
		}
	}
}

// SaveState writes every Q (the warm start), read from the device.
func (r *powersgd) SaveState(w *StateWriter) error {
	if !r.load && r.nq > 0 {
		v := &r.b.v
		if err := v.s.Copy(device.Host(r.q), r.dQ.Slice(0, r.nq)); err != nil {
			return fmt.Errorf("copying Q to the host: %w", err)
		}
		if err := v.s.Synchronize(); err != nil {
			return err
		}
	}
	w.Float32s(r.q)
	return nil
}

// LoadState reads the Q's back (uploaded by the next Reduce).
func (r *powersgd) LoadState(d *StateReader) error {
	q := d.Float32s("Q", r.nq)
	if err := d.Done(); err != nil {
		return err
	}
	copy(r.q, q)
	r.load = true
	return nil
}

// powersgdAdvice: two all-reduces, P's (with the dense tensors) and Q's,
// over each tensor's matrix as the reducer takes it (Shape.Tensor: of a
// tensor of unknown shape, the most nearly square matrix of its size).
var powersgdAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		r := s.Params.Int("rank")
		np, nq := 0, 0
		for i, d := range s.Sizes {
			rows, cols, k, ok := psgdShape(s.Tensor(i), r)
			if !ok {
				np += d
				continue
			}
			np += rows * k
			nq += cols * k
		}
		return []Call{{comm.OpAllReduce, 1, float64(np)}, {comm.OpAllReduce, 1, float64(nq)}}, nil
	},
	Volume: func(s Shape, _ Overlap) (sel, union float64) {
		return float64(s.N), float64(s.N)
	},
	Selection: SelectsWhole,
	Caveats: func(Conditions) []string {
		return []string{"its matrix products run in float64 (a GPU kernel of its own, not cuBLAS): O(N·r) per step"}
	},
	Evidence: Evidence{
		Shown:   []ModelKind{CNN, RNN, Recommender},
		Papers:  "Vogels et al. 2019: rank 2 reaches SGD's test accuracy on ResNet-18 on CIFAR-10 (94.4% vs 94.3%) and rank 4 SGD's perplexity on an LSTM on WikiText-2, at 1/136 and 1/113 of the traffic; rank 1 loses about 1 point on ResNet-18; PyTorch's DDP ships it as powerSGD_hook",
		Project: "NCF on MovieLens-100K, 16 workers, 20 epochs, rank 4: HR@10 0.608 against dense's 0.626 (docs/results/compressors.md); ResNet-18 bytes 1/243 of dense at rank 1, 1/72 at rank 4",
		Warning: "rank 1 can lose accuracy (about 1 point on ResNet-18 in the paper); no paper here shows it on Transformers; on NCF rank 4 trails dense by up to 0.02 HR@10"},
}
