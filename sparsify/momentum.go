package sparsify

import (
	"errors"
	"fmt"

	"github.com/sparsegrad/sparsegrad/device"
)

// momentumCorrection is DGC's momentum correction with momentum-factor
// masking (Lin et al. 2017), which DRAGONN's paper evaluated every method
// with: with momentum m > 0 (Options.Momentum, the optimizer's SGD
// momentum; the trainer then applies momentum to weight decay only) each
// worker keeps a momentum u and a velocity v per element of a compressed
// tensor, u ← m·u + g, v ← v + u, selects on v, sends v's values and zeroes
// u and v at the sent indices. In the reducer's contract (acc = residual +
// gradient) the residual written is v + m·u, so that the next acc is the
// next v; vel keeps the masked v, from which u = acc − v. Over a dense
// tensor vel is the momentum of the average, u ← m·u + mean_w(g_w), out = u.
type momentumCorrection struct {
	m   float32
	vel device.Buffer // Float32, N; allocated with the first call (has)
	has bool
}

// ensure allocates the zero velocity (m > 0).
func (c *momentumCorrection) ensure(b *Env) error {
	if c.m == 0 || c.has {
		return nil
	}
	v := &b.v
	var err error
	if c.vel, err = v.scratch(&c.vel, device.Float32, b.n); err != nil {
		return err
	}
	if err := v.m.Fill(v.s, c.vel, 0); err != nil {
		return err
	}
	c.has = true
	return nil
}

// becomeCompressed starts the correction of the tensors of the layout that
// are compressed from this call on, after dense calls (become): their
// momentum so far, the average's in vel, is every worker's u, and v starts
// at 0, so acc (the gradient, their residual being 0) becomes m·u + g, the
// first velocity, and vel 0.
func (c *momentumCorrection) becomeCompressed(b *Env, acc device.Buffer, become []bool) error {
	if c.m == 0 {
		return nil
	}
	v := &b.v
	for _, r := range tensorRuns(b.o.Layout, become, true) {
		u, a := c.vel.Slice(r[0], r[1]), acc.Slice(r[0], r[1])
		if err := v.m.Scale(v.s, u, c.m); err != nil {
			return err
		}
		if err := v.m.Add(v.s, a, u); err != nil {
			return err
		}
		if err := v.m.Fill(v.s, u, 0); err != nil {
			return err
		}
	}
	return nil
}

// compressed writes the residual v + m·u of the compressed tensors (comp)
// from acc, the velocity, and zeroes it and the kept velocity at the sent
// indices idx (momentum-factor masking).
func (c *momentumCorrection) compressed(b *Env, comp []bool, acc, residual, idx device.Buffer) error {
	v := &b.v
	for _, r := range tensorRuns(b.o.Layout, comp, true) {
		lo, hi := r[0], r[1]
		if err := v.ops.Run(v.s, dgcMomentum, hi-lo, c.vel.Slice(lo, hi), residual.Slice(lo, hi), acc.Slice(lo, hi), int64(hi-lo), c.m); err != nil {
			return err
		}
	}
	if err := v.ops.ScatterFill(v.s, c.vel, idx, 0); err != nil {
		return err
	}
	return v.ops.ScatterFill(v.s, residual, idx, 0)
}

// dense applies the momentum to the average out of the dense tensors (not
// comp): u ← m·u + out, out = u.
func (c *momentumCorrection) dense(b *Env, comp []bool, out device.Buffer) error {
	v := &b.v
	for _, r := range tensorRuns(b.o.Layout, comp, false) {
		lo, hi := r[0], r[1]
		u, o := c.vel.Slice(lo, hi), out.Slice(lo, hi)
		if err := v.m.Scale(v.s, u, c.m); err != nil {
			return err
		}
		if err := v.m.Add(v.s, u, o); err != nil {
			return err
		}
		if err := v.s.Copy(o, u); err != nil {
			return err
		}
	}
	return nil
}

// residualSq is ‖v‖² over the compressed tensors: what the worker holds
// back (Stats.ErrorNorm), not the residual, which also carries m·u.
func (c *momentumCorrection) residualSq(b *Env, comp []bool) (float64, error) {
	v := &b.v
	tensors := b.o.Layout.Tensors
	bounds := make([]int, 0, len(tensors)+1)
	for _, tn := range tensors {
		bounds = append(bounds, tn.Offset)
	}
	bounds = append(bounds, b.n)
	sq, err := v.ops.SegmentSumSquares(v.s, c.vel, bounds)
	if err != nil {
		return 0, err
	}
	var s float64
	for t := range tensors {
		if comp[t] {
			s += sq[t]
		}
	}
	return s, nil
}

// save writes whether there is a velocity and the velocity (N float32,
// read from the device).
func (c *momentumCorrection) save(b *Env, w *StateWriter) error {
	w.Bool(c.has)
	if c.has {
		v := &b.v
		vel := make([]float32, c.vel.Len())
		if err := v.s.Copy(device.Host(vel), c.vel); err != nil {
			return fmt.Errorf("reading the velocity back: %w", err)
		}
		if err := v.s.Synchronize(); err != nil {
			return fmt.Errorf("reading the velocity back: %w", err)
		}
		w.Float32s(vel)
	}
	return nil
}

// read reads what save wrote; load then puts it in place, after the
// reader's Done, of a reducer that has made calls calls.
func (c *momentumCorrection) read(b *Env, d *StateReader) (has bool, vel []float32) {
	has = d.Bool("velocity present")
	if has {
		vel = d.Float32s("velocity", b.n)
	}
	return has, vel
}

func (c *momentumCorrection) load(b *Env, has bool, vel []float32, calls int) error {
	if has && c.m == 0 {
		return errors.New("the state holds a momentum-corrected velocity, but this reducer has no momentum (Options.Momentum differs from the saved run's)")
	}
	if !has && c.m > 0 && calls > 0 {
		return errors.New("the state has no velocity, but this reducer corrects momentum (Options.Momentum differs from the saved run's)")
	}
	if !has {
		return nil
	}
	v := &b.v
	var err error
	if c.vel, err = v.scratch(&c.vel, device.Float32, b.n); err != nil {
		return err
	}
	if err := v.s.Copy(c.vel, device.Host(vel)); err != nil {
		return err
	}
	if err := v.s.Synchronize(); err != nil {
		return err
	}
	c.has = true
	return nil
}

// tensorRuns returns the ranges [lo, hi) of the layout covered by the
// tensors t with sel[t] == want, consecutive tensors adjoining in memory
// merged into one range, in layout order: element-wise passes over them
// take one launch a range instead of one a tensor.
func tensorRuns(l Layout, sel []bool, want bool) [][2]int {
	var runs [][2]int
	for t, tn := range l.Tensors {
		if sel[t] != want || tn.Size == 0 {
			continue
		}
		if n := len(runs); n > 0 && runs[n-1][1] == tn.Offset {
			runs[n-1][1] += tn.Size
			continue
		}
		runs = append(runs, [2]int{tn.Offset, tn.Offset + tn.Size})
	}
	return runs
}
