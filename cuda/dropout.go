package cuda

import (
	"fmt"

	"github.com/sparsegrad/sparsegrad/device"
)

// DropoutMask fills dst (float32 on d) on stream s with an inverted-
// dropout mask drawn on the GPU, the same bits as package models' masks
// on the CPU: element i is 0 where the low 53 bits of the (i+1)-th output
// of math/rand/v2's PCG from state (hi, lo) are below threshold, else keep.
// Each thread jumps ahead to its first element (the PCG is a 128-bit LCG)
// and then strides by the grid; nothing crosses the host but the state.
// The caller advances its own stream past dst.Len() draws.
func (d *Device) DropoutMask(s device.Stream, dst device.Buffer, hi, lo, threshold uint64, keep float32) error {
	cs, err := d.math.stream(s)
	if err != nil {
		return err
	}
	if err := device.CheckFloat32("DropoutMask", d, dst); err != nil {
		return err
	}
	if threshold > 1<<53 {
		return fmt.Errorf("cuda: DropoutMask: threshold %d is above 2^53 (a probability above 1)", threshold)
	}
	return cs.args().buf(dst).i64(dst.Len()).i64(int(hi)).i64(int(lo)).i64(int(threshold)).f32(keep).runN(kDropout, dst.Len())
}
