package sparsify

import (
	"context"
	_ "embed"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "efsignsgd", Projectable: true, New: newEFSignSGD, Advice: efsignAdvice, Kernels: []*device.Kernel{efsignKernel},
		Doc: "reference notes 11.1: EF-SignSGD (Karimireddy et al., 2019): each tensor of more than one dimension sent as its signs, packed 32 to a 4-byte word, and its scale ‖acc‖₁/d (one word), all-gathered; out = the mean of the workers' scaled signs; the residual is what the worker's own scaled signs left out (error feedback); 1-D tensors all-reduced dense. Deviations: ‖acc‖₁ is summed in float64 (blocks of 4096 elements in order, the blocks' sums in order, so a GPU gives the same bits) and rounded once; a zero counts as positive (one bit per element has no 0). On a GPU the passes are its kernel and the words stay in its memory."})
}

// efsign is "efsignsgd", EF-SignSGD (Karimireddy, Rebjock, Stich and
// Jaggi, ICML 2019, Algorithm 1: the scaled sign compressor
// C(p) = (‖p‖₁/d)·sign(p) with error feedback), made distributed by
// all-gathering the workers' compressed tensors, as DRAGONN's evaluation
// and GRACE run it (a sum of signs is not a sign, so they cannot be
// all-reduced):
//
//   - Per tensor of the layout with Dims() != 1 (a tensor of unknown shape
//     is compressed): scale s = ‖acc_t‖₁/d_t (summed in float64, in blocks
//     of efsignBlock elements, each in index order, then the blocks' sums
//     in order; rounded to float32 once), the sign bits of acc_t (bit j of word w set when
//     element 32w+j is negative; 0 and −0 count as +), packed 32 to an
//     int32 word, the tensor's words starting with s's bits: 1 + ⌈d_t/32⌉
//     words per tensor, all tensors in one AllGather of int32.
//   - out_t = (Σ_w s_w·sign_w) · (1/n), the sum in rank order in float32;
//     residual_t = acc_t − s·sign(acc_t), this worker's own compression
//     error.
//   - 1-D tensors (biases, batch-norm parameters): one AllReduce of all of
//     them, out = sum·(1/n), residual 0, as the authors' code leaves them
//     uncompressed.
//
// It conserves the gradient: Σ_w residual_w + n·out = Σ_w acc_w up to
// float32 rounding. Stats: Selected = Distinct = N (every element's value
// crosses the wire, compressed), Threshold = NaN.
type efsign struct {
	b     *Env
	comp  []int // compressed tensors
	dense []int // 1-D tensors
	words int   // this worker's words
	// Per compressed tensor: its message's first word, its first block
	// of partial sums; the blocks of all.
	wordOff, partOff []int
	parts            int
	dn               int // the 1-D tensors' elements
	send, recv       device.Buffer
	part, dbuf       device.Buffer
}

// efsignBlock is the elements of a block of the ‖x‖₁ sum (a GPU thread's
// share).
const efsignBlock = 4096

func newEFSignSGD(e *Env) (Core, error) {
	r := &efsign{b: e}
	for t, tn := range e.o.Layout.Tensors {
		if tn.Dims() == 1 {
			r.dense = append(r.dense, t)
			r.dn += tn.Size
			continue
		}
		r.comp = append(r.comp, t)
		r.wordOff = append(r.wordOff, r.words)
		r.partOff = append(r.partOff, r.parts)
		r.words += efsignWords(tn.Size)
		r.parts += efsignBlocks(tn.Size)
	}
	return r, nil
}

// efsignWords is the words of a compressed tensor of d elements: its scale
// and its signs.
func efsignWords(d int) int { return 1 + (d+31)/32 }

// efsignBlocks is the blocks of a compressed tensor of d elements.
func efsignBlocks(d int) int { return (d + efsignBlock - 1) / efsignBlock }

// Reduce compresses, all-gathers and decompresses, in the worker's device
// memory (efsignKernel).
func (r *efsign) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	v := &b.v
	n := b.c.Size()
	inv := 1 / float32(n)
	st.Selected, st.Distinct = b.n, b.n
	none := device.Buffer{}
	run := func(mode int32, m int, x, out, res device.Buffer, d, j int) error {
		return v.ops.Run(v.s, efsignKernel, m, x, r.send, r.recv, out, res, r.part, int64(m), int64(d), int32(j), int32(r.words), int32(n), inv, mode)
	}
	if r.dn > 0 {
		db, err := v.scratch(&r.dbuf, device.Float32, r.dn)
		if err != nil {
			return err
		}
		j := 0
		for _, t := range r.dense {
			tn := b.o.Layout.Tensors[t]
			if err := v.s.Copy(db.Slice(j, j+tn.Size), acc.Slice(tn.Offset, tn.Offset+tn.Size)); err != nil {
				return err
			}
			j += tn.Size
		}
		if err := b.c.AllReduce(ctx, v.cb(db)); err != nil {
			return fmt.Errorf("all-reducing the %d elements of the uncompressed tensors: %w", r.dn, err)
		}
		j = 0
		for _, t := range r.dense {
			tn := b.o.Layout.Tensors[t]
			lo, hi := tn.Offset, tn.Offset+tn.Size
			if err := run(4, tn.Size, db.Slice(j, j+tn.Size), out.Slice(lo, hi), residual.Slice(lo, hi), tn.Size, 0); err != nil {
				return err
			}
			j += tn.Size
		}
	}
	if r.words == 0 {
		return nil
	}
	var err error
	if r.send, err = v.scratch(&r.send, device.Int32, r.words); err != nil {
		return err
	}
	if r.recv, err = v.scratch(&r.recv, device.Int32, r.words*n); err != nil {
		return err
	}
	if r.part, err = v.scratch(&r.part, device.Float64, max(r.parts, 1)); err != nil {
		return err
	}
	selTime, err := b.selectTimed(func() error {
		for c, t := range r.comp {
			tn := b.o.Layout.Tensors[t]
			x := acc.Slice(tn.Offset, tn.Offset+tn.Size)
			part := r.part.Slice(r.partOff[c], r.partOff[c]+efsignBlocks(tn.Size))
			if err := v.ops.Run(v.s, efsignKernel, part.Len(), x, r.send, r.recv, none, none, part, int64(part.Len()), int64(tn.Size), int32(r.wordOff[c]), int32(r.words), int32(n), inv, int32(0)); err != nil {
				return err
			}
			if err := v.ops.Run(v.s, efsignKernel, 1, x, r.send, r.recv, none, none, part, int64(1), int64(tn.Size), int32(r.wordOff[c]), int32(r.words), int32(n), inv, int32(1)); err != nil {
				return err
			}
			if err := run(2, (tn.Size+31)/32, x, none, none, tn.Size, r.wordOff[c]); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	st.SelectTime = selTime
	if err := b.c.AllGather(ctx, v.cb(r.send), v.cb(r.recv)); err != nil {
		return fmt.Errorf("all-gathering %d words of signs and scales: %w", r.words, err)
	}
	for c, t := range r.comp {
		tn := b.o.Layout.Tensors[t]
		lo, hi := tn.Offset, tn.Offset+tn.Size
		// acc may be residual's memory: each element is read before its
		// residual is written.
		if err := run(3, tn.Size, acc.Slice(lo, hi), out.Slice(lo, hi), residual.Slice(lo, hi), tn.Size, r.wordOff[c]); err != nil {
			return err
		}
	}
	return nil
}

//go:embed efsignsgd.cu
var efsignCUDA string

// efsignKernel is EF-SignSGD's passes over one tensor (efsignsgd.cu's
// k_efsign; arguments x, send (Int32), recv (Int32), out, res, part
// (Float64), n as int64, the tensor's d as int64, its message's first word
// j, the words tw of a worker's message and the workers nw as int32, inv
// as float32, mode as int32; the file says what each mode does).
var efsignKernel = &device.Kernel{Name: "k_efsign", CUDA: efsignCUDA, Host: func(n int, a ...any) {
	buf := func(i int) device.Buffer { return a[i].(device.Buffer) }
	d, j, tw, nw, inv := int(a[7].(int64)), int(a[8].(int32)), int(a[9].(int32)), int(a[10].(int32)), a[11].(float32)
	switch a[12].(int32) {
	case 0:
		x, part := buf(0).Float32s(), buf(5).Float64s()
		for i := range n {
			var s float64
			for _, v := range x[i*efsignBlock : min((i+1)*efsignBlock, d)] {
				s += math.Abs(float64(v))
			}
			part[i] = s
		}
	case 1:
		var s float64
		for _, p := range buf(5).Float64s()[:efsignBlocks(d)] {
			s += p
		}
		var sc float32
		if d > 0 {
			sc = float32(s / float64(d))
		}
		buf(1).Int32s()[j] = int32(math.Float32bits(sc))
	case 2:
		x, send := buf(0).Float32s(), buf(1).Int32s()
		for w := range n {
			var u uint32
			for k := range min(32, d-32*w) {
				if x[32*w+k] < 0 {
					u |= 1 << k
				}
			}
			send[j+1+w] = int32(u)
		}
	case 3:
		x, send, recv, out, res := buf(0).Float32s(), buf(1).Int32s(), buf(2).Int32s(), buf(3).Float32s(), buf(4).Float32s()
		o := out[:n]
		// Each element's sum of ±s_p from 0 in rank order.
		clear(o)
		for p := range nw {
			msg := recv[p*tw+j:]
			s := math.Float32frombits(uint32(msg[0]))
			for i := range o {
				if uint32(msg[1+i/32])>>(i%32)&1 != 0 {
					o[i] += -s
				} else {
					o[i] += s
				}
			}
		}
		s := math.Float32frombits(uint32(send[j]))
		for i := range o {
			o[i] *= inv
			if a := x[i]; a < 0 {
				res[i] = a + s
			} else {
				res[i] = a - s
			}
		}
	case 4:
		x, out, res := buf(0).Float32s(), buf(3).Float32s(), buf(4).Float32s()
		for i := range n {
			out[i], res[i] = x[i]*inv, 0
		}
	}
}}

// efsignAdvice: one AllGather of the compressed tensors' words (scale and
// packed signs) and one AllReduce of the 1-D tensors (Shape.Tensor: a
// tensor of unknown shape is compressed, as the reducer does).
var efsignAdvice = &Advice{
	Plan: func(s Shape) ([]Call, error) {
		w, dense := 0, 0
		for i, d := range s.Sizes {
			if s.Tensor(i).Dims() == 1 {
				dense += d
				continue
			}
			w += efsignWords(d)
		}
		var calls []Call
		if w > 0 {
			calls = append(calls, Call{comm.OpAllGather, 1, float64(w)})
		}
		if dense > 0 {
			calls = append(calls, Call{comm.OpAllReduce, 1, float64(dense)})
		}
		return calls, nil
	},
	Volume: func(s Shape, _ Overlap) (sel, union float64) {
		return float64(s.N), float64(s.N)
	},
	Selection: SelectsWhole,
	Caveats: func(Conditions) []string {
		return []string{"its all-gather grows with the workers: each worker receives every other's signs"}
	},
	Evidence: Evidence{
		Shown:   []ModelKind{CNN, RNN},
		Papers:  "Karimireddy et al. 2019: EF-SignSGD matches SGD with momentum on VGG-19 and ResNet-18 on CIFAR-10/100 (single worker, 1 bit per element); Vogels et al. 2019 (PowerSGD's Table 1) and DRAGONN's Figure 7 run it distributed at 1/32 of the traffic, with a small loss of accuracy on ResNet-18 and LSTMs",
		Warning: "one bit per element: on Transformers and recommenders no paper here shows it at dense accuracy"},
}
