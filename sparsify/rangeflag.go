package sparsify

import (
	_ "embed"
	"fmt"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

//go:embed rangeflag.cu
var rangeFlagCUDA string

// rangeFlagKernel is rangeflag.cu's k_range_flag (arguments idx (Int32),
// n and lim as int64, flag (one Int64)).
var rangeFlagKernel = &device.Kernel{Name: "k_range_flag", CUDA: rangeFlagCUDA, Host: func(n int, a ...any) {
	idx, lim, flag := a[0].(device.Buffer).Int32s(), a[2].(int64), a[3].(device.Buffer).Int64s()
	for i, v := range idx[:n] {
		if v < 0 || int64(v) >= lim {
			if f := uint64(i)<<32 | uint64(uint32(v)); f < uint64(flag[0]) {
				flag[0] = int64(f)
			}
			idx[i] = 0
		}
	}
}}

// rangeClear is a range check's flag before any index failed it (all
// bits set).
const rangeClear = -1

// rangeChecks are the range checks of index lists received in the call in
// flight (Env.checkRange): a flag each on the device, copied to the host
// with the frame's wait (Reducer.combine).
type rangeChecks struct {
	dev  device.Buffer // Int64, one per check
	host []int64       // page-locked where the device allocates that
	// pending are the checks issued in the call, with what each
	// explains; copied says their flags' copy to the host was issued, and
	// done is its event (nil on the CPU).
	pending []rangeCheck
	copied  bool
	done    device.Event
	// dirty says that a flag may be lowered (a failed call's): they are
	// all set again before the next check.
	dirty bool
}

type rangeCheck struct {
	lim  int
	wrap func(error) error
}

// checkRange is Ops.InRange of idx against [0, lim) without a wait of its
// own: an index outside is replaced by 0 (the passes over idx that follow
// stay in bounds) and lowers a flag on the device that the frame reads
// with its own wait when it combines the call's statistics; the call then
// fails with wrap's error of the first such index (its position in idx and
// its value). No allocation once the call's checks have been issued once.
func (e *Env) checkRange(idx device.Buffer, lim int, wrap func(error) error) error {
	flag, err := e.rangeFlag(lim, wrap)
	if err != nil || idx.Len() == 0 {
		return err
	}
	return e.v.ops.Run(e.v.s, rangeFlagKernel, idx.Len(), idx, int64(idx.Len()), int64(lim), flag)
}

// rangeFlag registers a range check against [0, lim) and returns its flag
// (one Int64 word on the device, rangeClear until an index fails), for a
// method's kernel that checks a list as k_range_flag does while it makes a
// pass of its own over it (LAGS' distinct count).
func (e *Env) rangeFlag(lim int, wrap func(error) error) (device.Buffer, error) {
	v, rc := &e.v, &e.ranges
	j := len(rc.pending)
	if rc.copied {
		return device.Buffer{}, fmt.Errorf("sparsify: a range check after the call's checks were read")
	}
	if j >= rc.dev.Len() || rc.dirty {
		if err := rc.reset(v, max(j+1, 2*rc.dev.Len())); err != nil {
			return device.Buffer{}, err
		}
	}
	rc.pending = append(rc.pending, rangeCheck{lim, wrap})
	return rc.dev.Slice(j, j+1), nil
}

// reset sets every flag (and the first n, growing the flags to n where they
// are fewer, keeping those of the checks pending) to rangeClear.
func (rc *rangeChecks) reset(v *vecs, n int) error {
	if n > rc.dev.Len() {
		old := rc.dev
		b, err := v.d.Alloc(device.Int64, n)
		if err != nil {
			return fmt.Errorf("sparsify: range check flags: %w", err)
		}
		host := make([]int64, n)
		if p, ok := v.d.(interface{ AllocPinned(n int) ([]byte, error) }); ok && !v.onCPU() {
			mem, err := p.AllocPinned(8 * n)
			if err != nil {
				return fmt.Errorf("sparsify: range check flags: %w", err)
			}
			host = unsafe.Slice((*int64)(unsafe.Pointer(&mem[0])), n)
		}
		for i := range host {
			host[i] = rangeClear
		}
		if err := v.s.Copy(b, device.Host(host)); err != nil {
			return err
		}
		if k := len(rc.pending); k > 0 && !rc.dirty {
			if err := v.s.Copy(b.Slice(0, k), old.Slice(0, k)); err != nil {
				return err
			}
		}
		if old.Len() > 0 {
			if err := v.s.Synchronize(); err != nil { // the copies read old
				return err
			}
			if err := v.d.Free(old); err != nil {
				return err
			}
		}
		rc.dev, rc.host, rc.dirty = b, host, false
		return nil
	}
	for i := range rc.host {
		rc.host[i] = rangeClear
	}
	rc.dirty = false
	if err := v.s.Copy(rc.dev, device.Host(rc.host)); err != nil {
		return err
	}
	return v.s.Synchronize() // host is read into again
}

// readRanges issues the copy of the call's range checks' flags to the
// host, before the frame's wait (nothing without checks).
func (e *Env) readRanges() error {
	v, rc := &e.v, &e.ranges
	if len(rc.pending) == 0 || rc.copied {
		return nil
	}
	n := len(rc.pending)
	if err := v.s.Copy(device.Host(rc.host[:n]), rc.dev.Slice(0, n)); err != nil {
		return err
	}
	rc.copied = true
	if !v.onCPU() {
		ev, err := v.s.Record()
		if err != nil {
			return err
		}
		rc.done = ev
	}
	return nil
}

// rangeErr returns the error of the call's first range check an index
// failed (nil when none did), after readRanges' copy has completed
// (waiting for it only where the frame made no wait since), and forgets the
// call's checks.
func (e *Env) rangeErr() error {
	rc := &e.ranges
	if len(rc.pending) == 0 {
		return nil
	}
	if err := e.readRanges(); err != nil {
		return err
	}
	defer e.forgetRanges()
	if ev := rc.done; ev != nil {
		if d, ok := ev.(interface{ Done() bool }); !ok || !d.Done() {
			if err := ev.Synchronize(); err != nil {
				return err
			}
		}
	}
	for j, c := range rc.pending {
		f := rc.host[j]
		if f == rangeClear {
			continue
		}
		rc.dirty = true
		pos, val := uint64(f)>>32, int32(uint32(f))
		return c.wrap(fmt.Errorf("index %d (element %d of the list) is outside [0, %d)", val, pos, c.lim))
	}
	return nil
}

// forgetRanges ends the call's range checks (a failed call's flags are set
// again before the next check).
func (e *Env) forgetRanges() {
	rc := &e.ranges
	if len(rc.pending) > 0 && !rc.copied {
		rc.dirty = true
	}
	rc.pending, rc.copied, rc.done = rc.pending[:0], false, nil
}
