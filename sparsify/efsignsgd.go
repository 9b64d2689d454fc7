package sparsify

import (
	"context"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

func init() {
	Register(Method{Name: "efsignsgd", Projectable: true, New: newEFSignSGD, Advice: efsignAdvice,
		Doc: "reference notes 11.1: EF-SignSGD (Karimireddy et al., 2019): each tensor of more than one dimension sent as its signs, packed 32 to a 4-byte word, and its scale ‖acc‖₁/d (one word), all-gathered; out = the mean of the workers' scaled signs; the residual is what the worker's own scaled signs left out (error feedback); 1-D tensors all-reduced dense. Deviations: ‖acc‖₁ is summed in float64 and rounded once; a zero's sign is + (one bit per element has no 0); computed on the host (a GPU's vectors are copied there and back)."})
}

// efsign is "efsignsgd", EF-SignSGD (Karimireddy, Rebjock, Stich and
// Jaggi, ICML 2019, Algorithm 1: the scaled sign compressor
// C(p) = (‖p‖₁/d)·sign(p) with error feedback), made distributed by
// all-gathering the workers' compressed tensors, as DRAGONN's evaluation
// and GRACE run it (a sum of signs is not a sign, so they cannot be
// all-reduced):
//
//   - Per tensor of the layout with Dims() != 1 (a tensor of unknown shape
//     is compressed): scale s = ‖acc_t‖₁/d_t (float64 sum, rounded to
//     float32 once), the sign bits of acc_t (bit j of word w set when
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
	b      *Env
	h      hostVecs
	comp   []int // compressed tensors
	dense  []int // 1-D tensors
	words  int   // this worker's words
	send   []int32
	recv   []int32
	dbuf   []float32
	scales []float32
}

func newEFSignSGD(e *Env) (Core, error) {
	r := &efsign{b: e}
	for t, tn := range e.o.Layout.Tensors {
		if tn.Dims() == 1 {
			r.dense = append(r.dense, t)
			continue
		}
		r.comp = append(r.comp, t)
		r.words += efsignWords(tn.Size)
	}
	return r, nil
}

// efsignWords is the words of a compressed tensor of d elements: its scale
// and its signs.
func efsignWords(d int) int { return 1 + (d+31)/32 }

// Reduce compresses, all-gathers and decompresses.
func (r *efsign) Reduce(ctx context.Context, _ int, acc, out, residual device.Buffer, st *GroupStats) error {
	b := r.b
	h := &r.h
	if err := b.hostIn(h, acc, out, residual); err != nil {
		return err
	}
	if _, err := b.denseTensors(ctx, h, r.dense, &r.dbuf); err != nil {
		return err
	}
	if r.words > 0 {
		n := b.c.Size()
		r.send = grow(r.send, r.words)
		r.recv = grow(r.recv, r.words*n)
		r.scales = grow(r.scales, len(r.comp))
		selTime, err := b.timed(func() error {
			j := 0
			for c, t := range r.comp {
				tn := b.o.Layout.Tensors[t]
				x := h.acc[tn.Offset : tn.Offset+tn.Size]
				s := efsignScale(x)
				r.scales[c] = s
				j += efsignPack(r.send[j:], x, s)
			}
			return nil
		})
		if err != nil {
			return err
		}
		st.SelectTime = selTime
		if err := b.c.AllGather(ctx, comm.Int32s(r.send), comm.Int32s(r.recv)); err != nil {
			return fmt.Errorf("all-gathering %d words of signs and scales: %w", r.words, err)
		}
		inv := 1 / float32(n)
		j := 0
		for c, t := range r.comp {
			tn := b.o.Layout.Tensors[t]
			w := efsignWords(tn.Size)
			o := h.out[tn.Offset : tn.Offset+tn.Size]
			// Each element's sum of ±s_p from 0 in rank order.
			clear(o)
			for p := range n {
				msg := r.recv[p*r.words+j:][:w]
				s := math.Float32frombits(uint32(msg[0]))
				for k, word := range msg[1:] {
					u := uint32(word)
					blk := o[32*k : min(32*k+32, len(o))]
					for b := range blk {
						if u>>b&1 != 0 {
							blk[b] += -s
						} else {
							blk[b] += s
						}
					}
				}
			}
			for i := range o {
				o[i] *= inv
			}
			// The residual after out: acc may be residual's memory.
			s := r.scales[c]
			x := h.acc[tn.Offset : tn.Offset+tn.Size]
			res := h.res[tn.Offset : tn.Offset+tn.Size]
			for i, a := range x {
				if a < 0 {
					res[i] = a + s
				} else {
					res[i] = a - s
				}
			}
			j += w
		}
	}
	if err := b.hostOut(h, out, residual); err != nil {
		return err
	}
	st.Selected, st.Distinct = b.n, b.n
	return nil
}

// efsignScale is ‖x‖₁/len(x), summed in float64 and rounded once (0 for
// an empty x).
func efsignScale(x []float32) float32 {
	if len(x) == 0 {
		return 0
	}
	var s float64
	for _, v := range x {
		s += math.Abs(float64(v))
	}
	return float32(s / float64(len(x)))
}

// efsignPack writes x's message into w: the scale's bits, then the sign
// bits (set for negative elements), and returns the words written.
func efsignPack(w []int32, x []float32, s float32) int {
	w[0] = int32(math.Float32bits(s))
	nw := (len(x) + 31) / 32
	for i := range nw {
		var u uint32
		for j := range min(32, len(x)-32*i) {
			if x[32*i+j] < 0 {
				u |= 1 << j
			}
		}
		w[1+i] = int32(u)
	}
	return 1 + nw
}

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
