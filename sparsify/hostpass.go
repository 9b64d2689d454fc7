package sparsify

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// Host passes shared by the compressors that work tensor by tensor on the
// host (efsignsgd, powersgd): a call's vectors as host slices, and the
// tensors a compressor leaves uncompressed all-reduced in one call.

// hostVecs are a call's acc, out and residual as host slices: the vectors'
// own memory on the CPU; on another device, host copies (acc downloaded by
// hostIn, out and residual uploaded by hostOut).
type hostVecs struct{ acc, out, res []float32 }

// hostIn makes h the host view of acc, out and residual.
func (b *Env) hostIn(h *hostVecs, acc, out, residual device.Buffer) error {
	v := &b.v
	if v.onCPU() {
		h.acc, h.out, h.res = acc.Float32s(), out.Float32s(), residual.Float32s()
		return nil
	}
	h.acc, h.out, h.res = grow(h.acc, b.n), grow(h.out, b.n), grow(h.res, b.n)
	if b.n == 0 {
		return nil
	}
	if err := v.s.Copy(device.Host(h.acc), acc); err != nil {
		return fmt.Errorf("copying acc to the host: %w", err)
	}
	return v.s.Synchronize()
}

// hostOut copies the host view's out and residual back to the device.
func (b *Env) hostOut(h *hostVecs, out, residual device.Buffer) error {
	v := &b.v
	if v.onCPU() || b.n == 0 {
		return nil
	}
	if err := v.s.Copy(out, device.Host(h.out)); err != nil {
		return fmt.Errorf("copying out to the device: %w", err)
	}
	if err := v.s.Copy(residual, device.Host(h.res)); err != nil {
		return fmt.Errorf("copying the residual to the device: %w", err)
	}
	return v.s.Synchronize()
}

// denseTensors all-reduces the tensors ts of the layout (indices into
// Layout.Tensors) in one call: out = the sum over the workers times 1/n
// there, residual 0. buf is the scratch that carries them. It returns the
// elements sent.
func (b *Env) denseTensors(ctx context.Context, h *hostVecs, ts []int, buf *[]float32) (int, error) {
	m := 0
	for _, t := range ts {
		m += b.o.Layout.Tensors[t].Size
	}
	if m == 0 {
		return 0, nil
	}
	s := grow(*buf, m)
	*buf = s
	j := 0
	for _, t := range ts {
		tn := b.o.Layout.Tensors[t]
		j += copy(s[j:], h.acc[tn.Offset:tn.Offset+tn.Size])
	}
	if err := b.c.AllReduce(ctx, comm.Float32s(s)); err != nil {
		return 0, fmt.Errorf("all-reducing the %d elements of the uncompressed tensors: %w", m, err)
	}
	inv := 1 / float32(b.c.Size())
	j = 0
	for _, t := range ts {
		tn := b.o.Layout.Tensors[t]
		for i := tn.Offset; i < tn.Offset+tn.Size; i++ {
			h.out[i] = s[j] * inv
			h.res[i] = 0
			j++
		}
	}
	return m, nil
}
