package sparsify

import (
	"context"
	"fmt"
	"math"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/options"
)

// The size cut-off every method takes (option min_compress_size, flag
// -min-compress-size): as Horovod, GRACE and DRAGONN's evaluation do, the
// tensors of fewer elements are all-reduced dense by the frame, outside
// the method, and counted as such; the method's core sees the layout of
// the others only. 0, the default, leaves every tensor to the method: each
// paper's own behaviour (DGC's 1-D rule, DRAGONN's min_tensor, the
// compressors' 1-D tensors stay the method's).

// minCompressName is the option's key.
const minCompressName = "min_compress_size"

// minCompressParam is the option Register adds to every method but dense.
var minCompressParam = options.Option{Key: minCompressName, Kind: options.Int, Default: 0, Range: options.Within(0, math.MaxInt32, "[]"),
	Doc: "tensors of fewer elements are all-reduced dense by the frame, outside the method, and counted as such (0: none, the method's paper's behaviour)"}

// cutoff is a core that all-reduces the layout's small tensors dense and
// hands the rest, as one compact vector, to the method's core (inner, built
// on its own Env over the compact layout).
type cutoff struct {
	e, ie  *Env
	inner  Core
	small  []layout.Tensor // in the full layout
	big    []layout.Tensor // in the full layout
	ns     int             // elements of the small tensors
	dAcc   device.Buffer   // compact acc, out, residual
	dOut   device.Buffer
	dRes   device.Buffer
	dDense device.Buffer
}

// cutoffStateful is a cutoff whose inner core keeps state.
type cutoffStateful struct{ *cutoff }

// withCutoff returns core unchanged when no tensor of e's layout is below
// the cut-off, else the cutoff core over a method core built by build on
// the compact layout of the other tensors.
func withCutoff(m Method, e *Env, build func(*Env) (Core, error)) (Core, error) {
	min := 0
	if _, ok := m.Param(minCompressName); ok {
		min = e.o.Params.Int(minCompressName)
	}
	c := &cutoff{e: e}
	for _, t := range e.o.Layout.Tensors {
		if t.Size < min {
			c.small = append(c.small, t)
			c.ns += t.Size
		} else {
			c.big = append(c.big, t)
		}
	}
	if len(c.small) == 0 {
		return build(e)
	}
	if m.Pipelined {
		return nil, fmt.Errorf("%s=%d: %s reduces its own groups during the backward pass; its tensors cannot be cut by size (use 0)", minCompressName, min, m.Name)
	}
	o := e.o
	o.Comm = e.c // one counter for both
	if len(c.big) > 0 {
		ts := make([]layout.Tensor, len(c.big))
		for i, t := range c.big {
			t.Offset = 0
			ts[i] = t
		}
		l, err := layout.Of(ts)
		if err != nil {
			return nil, err
		}
		o.Layout = l
		c.ie = newEnv(o)
		inner, err := build(c.ie)
		if err != nil {
			return nil, err
		}
		if _, ok := inner.(Grouped); ok {
			return nil, fmt.Errorf("%s=%d: %s reduces groups of its own; its tensors cannot be cut by size (use 0)", minCompressName, min, m.Name)
		}
		c.inner = inner
		if _, ok := inner.(Stateful); ok {
			return cutoffStateful{c}, nil
		}
	}
	return c, nil
}

// copyTensors copies the tensors ts of the full vector x into the compact
// vector dst (toCompact) or back.
func (c *cutoff) copyTensors(ts []layout.Tensor, full, compact device.Buffer, toCompact bool) error {
	s := c.e.v.s
	j := 0
	for _, t := range ts {
		f, p := full.Slice(t.Offset, t.Offset+t.Size), compact.Slice(j, j+t.Size)
		var err error
		if toCompact {
			err = s.Copy(p, f)
		} else {
			err = s.Copy(f, p)
		}
		if err != nil {
			return err
		}
		j += t.Size
	}
	return nil
}

// Reduce all-reduces the small tensors and reduces the others with the
// method's core.
func (c *cutoff) Reduce(ctx context.Context, g int, acc, out, residual device.Buffer, st *GroupStats) error {
	e := c.e
	v := &e.v
	nb := e.n - c.ns
	dense, err := v.scratch(&c.dDense, device.Float32, c.ns)
	if err != nil {
		return err
	}
	if err := c.copyTensors(c.small, acc, dense, true); err != nil {
		return err
	}
	var a, o, r device.Buffer
	if c.inner != nil {
		if a, err = v.scratch(&c.dAcc, device.Float32, nb); err != nil {
			return err
		}
		if o, err = v.scratch(&c.dOut, device.Float32, nb); err != nil {
			return err
		}
		if r, err = v.scratch(&c.dRes, device.Float32, nb); err != nil {
			return err
		}
		if err := c.copyTensors(c.big, acc, a, true); err != nil {
			return err
		}
	}
	if err := e.c.AllReduce(ctx, v.cb(dense)); err != nil {
		return fmt.Errorf("all-reducing the %d elements of the tensors below %s: %w", c.ns, minCompressName, err)
	}
	if err := v.m.Scale(v.s, dense, 1/float32(e.c.Size())); err != nil {
		return err
	}
	if err := c.copyTensors(c.small, out, dense, false); err != nil {
		return err
	}
	for _, t := range c.small {
		if err := v.m.Fill(v.s, residual.Slice(t.Offset, t.Offset+t.Size), 0); err != nil {
			return err
		}
	}
	if c.inner == nil {
		st.Selected, st.Distinct, st.ResidualSq = c.ns, c.ns, 0
		return nil
	}
	c.ie.calls, c.ie.perEpoch = e.calls, e.perEpoch
	if err := c.inner.Reduce(ctx, g, a, o, r, st); err != nil {
		return err
	}
	if err := c.copyTensors(c.big, out, o, false); err != nil {
		return err
	}
	if err := c.copyTensors(c.big, residual, r, false); err != nil {
		return err
	}
	st.Selected += c.ns
	st.Distinct += c.ns
	if st.LayerK != nil {
		lk := make([]int, len(e.o.Layout.Tensors))
		b, s := 0, 0
		for i, t := range e.o.Layout.Tensors {
			if s < len(c.small) && c.small[s].Offset == t.Offset {
				lk[i] = t.Size
				s++
			} else {
				lk[i] = st.LayerK[b]
				b++
			}
		}
		st.LayerK = lk
	}
	return nil
}

// SaveState writes the inner core's state.
func (c cutoffStateful) SaveState(w *StateWriter) error {
	return c.inner.(Stateful).SaveState(w)
}

// LoadState reads the inner core's state, and the calls it counts.
func (c cutoffStateful) LoadState(d *StateReader) error {
	if err := c.inner.(Stateful).LoadState(d); err != nil {
		return err
	}
	c.e.calls = c.ie.calls
	return nil
}
