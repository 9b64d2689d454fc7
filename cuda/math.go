package cuda

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// gpuMath is device.Math on a GPU: one kernel per operation.
type gpuMath struct{ d *Device }

var _ device.Math = (*gpuMath)(nil)

// stream returns s as a stream of this device.
func (m *gpuMath) stream(s device.Stream) (*Stream, error) {
	cs, ok := s.(*Stream)
	if !ok || cs.d != m.d {
		return nil, fmt.Errorf("cuda: %T is not a stream of %v", s, m.d)
	}
	return cs, nil
}

func (m *gpuMath) SGD(s device.Stream, p device.SGDStep, w, g, buf device.Buffer) error {
	cs, err := m.stream(s)
	if err != nil {
		return err
	}
	args := []device.Buffer{w, g}
	if p.Momentum != 0 {
		args = append(args, buf)
	} else {
		buf = device.Buffer{}
	}
	if err := device.CheckFloat32("SGD", m.d, args...); err != nil {
		return err
	}
	return cs.args().buf(w).buf(g).buf(buf).i64(w.Len()).f32(p.LR).f32(p.Momentum).f32(p.WeightDecay).flag(p.Nesterov).flag(p.First).runN(kSgd, w.Len())
}

func (m *gpuMath) Adam(s device.Stream, p device.AdamStep, w, g, mv, vv device.Buffer) error {
	cs, err := m.stream(s)
	if err != nil {
		return err
	}
	if err := device.CheckFloat32("Adam", m.d, w, g, mv, vv); err != nil {
		return err
	}
	return cs.args().buf(w).buf(g).buf(mv).buf(vv).i64(w.Len()).f32(p.StepSize).f32(p.Beta1).f32(p.Beta2).f32(p.Eps).f32(p.SqrtBC2).runN(kAdam, w.Len())
}

// SumSquares implements device.Math: per-block partial sums in double,
// then their sum, copied to the host (the stream is synchronized).
func (m *gpuMath) SumSquares(s device.Stream, x device.Buffer) (float64, error) {
	cs, err := m.stream(s)
	if err != nil {
		return 0, err
	}
	if err := device.CheckFloat32("SumSquares", m.d, x); err != nil {
		return 0, err
	}
	if x.Len() == 0 {
		return 0, nil
	}
	part, err := cs.scratch()
	if err != nil {
		return 0, err
	}
	g := min(cs.grid(x.Len()), part.Len()-1)
	if err := cs.args().buf(x).i64(x.Len()).buf(part).run(kSumsqPartial, g); err != nil {
		return 0, err
	}
	if err := cs.args().buf(part).i32(g).buf(part.Slice(g, g+1)).run(kSumPartials, 1); err != nil {
		return 0, err
	}
	var out [1]float64
	if err := cs.Copy(device.Host(out[:]), part.Slice(g, g+1)); err != nil {
		return 0, err
	}
	if err := cs.Synchronize(); err != nil {
		return 0, err
	}
	return out[0], nil
}

// scratch returns the stream's reduction scratch (allocated once).
func (s *Stream) scratch() (device.Buffer, error) {
	if s.part.Len() == 0 {
		b, err := s.d.Alloc(device.Float64, 32*s.d.sms+1)
		if err != nil {
			return device.Buffer{}, err
		}
		s.part = b
	}
	return s.part, nil
}

func (m *gpuMath) Scale(s device.Stream, x device.Buffer, a float32) error {
	cs, err := m.stream(s)
	if err != nil {
		return err
	}
	if err := device.CheckFloat32("Scale", m.d, x); err != nil {
		return err
	}
	return cs.args().buf(x).i64(x.Len()).f32(a).runN(kScale, x.Len())
}

func (m *gpuMath) Fill(s device.Stream, x device.Buffer, v float32) error {
	cs, err := m.stream(s)
	if err != nil {
		return err
	}
	if err := device.CheckFloat32("Fill", m.d, x); err != nil {
		return err
	}
	return cs.fill32(x, math.Float32bits(v))
}

// fill32 sets every 32-bit element of x to bits.
func (s *Stream) fill32(x device.Buffer, bits uint32) error {
	if x.Len() == 0 {
		return nil
	}
	unlock, err := s.enter()
	if err != nil {
		return err
	}
	defer unlock()
	counts.launches.Add(1)
	if err := check("cuMemsetD32Async", drv.cuMemsetD32Async(uint64(x.Addr()), bits, uint64(x.Bytes()/4), s.h)); err != nil {
		return err
	}
	return s.checkLaunch("cuMemsetD32Async")
}

func (m *gpuMath) Add(s device.Stream, y, x device.Buffer) error {
	cs, err := m.stream(s)
	if err != nil {
		return err
	}
	if err := device.CheckFloat32("Add", m.d, y, x); err != nil {
		return err
	}
	return cs.args().buf(y).buf(x).i64(y.Len()).runN(kAdd, y.Len())
}

var _ = unsafe.Pointer(nil)
