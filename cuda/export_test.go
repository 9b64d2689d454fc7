package cuda

import (
	"sync"
	"testing"
)

// EmulateGPUs makes the emulator show n GPUs until t ends and reports
// whether the tests run on the emulator (false: a real GPU machine, where
// nothing changes).
func EmulateGPUs(t testing.TB, n int) bool {
	if !emulated {
		return false
	}
	old := emuGPUs
	emuGPUs = n
	t.Cleanup(func() { emuGPUs = old })
	return true
}

// KeepAnchor stops the event clock's anchor from being refreshed until t
// ends (a refresh waits for the device once every 10 s, which would make
// the counts of a slow emulated run depend on its speed).
func KeepAnchor(t testing.TB) {
	old := anchorAge
	anchorAge = 1 << 62
	t.Cleanup(func() { anchorAge = old })
}

// EmulateFreeMemory makes the emulated GPUs report free bytes of free
// memory until t ends and reports whether the tests run on the emulator.
func EmulateFreeMemory(t testing.TB, free uint64) bool {
	if !emulated {
		return false
	}
	old := emuFree
	emuFree = free
	t.Cleanup(func() { emuFree = old })
	return true
}

// CountHandles counts, until t ends, the streams and the cuBLAS and cuDNN
// handles the emulated libraries create and destroy from now on: live
// returns how many of those are not destroyed yet. It reports false on a
// real GPU (nothing is counted).
func CountHandles(t testing.TB) (live func() (streams, blas, dnn int), ok bool) {
	if !emulated {
		return nil, false
	}
	var mu sync.Mutex
	made := [3]map[uintptr]bool{{}, {}, {}}
	add := func(kind int, h uintptr) {
		mu.Lock()
		made[kind][h] = true
		mu.Unlock()
	}
	del := func(kind int, h uintptr) {
		mu.Lock()
		delete(made[kind], h)
		mu.Unlock()
	}
	sc, sd, bc, bd, nc, nd := drv.cuStreamCreate, drv.cuStreamDestroy, cublas.create, cublas.destroy, cudnn.create, cudnn.destroy
	t.Cleanup(func() {
		drv.cuStreamCreate, drv.cuStreamDestroy, cublas.create, cublas.destroy, cudnn.create, cudnn.destroy = sc, sd, bc, bd, nc, nd
	})
	drv.cuStreamCreate = func(h *uintptr, flags uint32) cuResult {
		r := sc(h, flags)
		if r == 0 {
			add(0, *h)
		}
		return r
	}
	drv.cuStreamDestroy = func(h uintptr) cuResult { del(0, h); return sd(h) }
	cublas.create = func(h *uintptr) int32 {
		r := bc(h)
		if r == 0 {
			add(1, *h)
		}
		return r
	}
	cublas.destroy = func(h uintptr) int32 { del(1, h); return bd(h) }
	cudnn.create = func(h *uintptr) int32 {
		r := nc(h)
		if r == 0 {
			add(2, *h)
		}
		return r
	}
	cudnn.destroy = func(h uintptr) int32 { del(2, h); return nd(h) }
	return func() (int, int, int) {
		mu.Lock()
		defer mu.Unlock()
		return len(made[0]), len(made[1]), len(made[2])
	}, true
}

// NoPeerAccess makes the emulated GPUs answer, until t ends, that they
// cannot access each other's memory (PCIe without peer-to-peer), and
// reports whether the tests run on the emulator.
func NoPeerAccess(t testing.TB) bool {
	if !emulated {
		return false
	}
	old := emuNoPeer
	emuNoPeer = true
	t.Cleanup(func() { emuNoPeer = old })
	return true
}

// PeerAccessEnabled reports whether the emulated GPU a has enabled its
// access to GPU b's memory (false on a real GPU).
func PeerAccessEnabled(a, b int) bool {
	if !emulated {
		return false
	}
	e := emuSrv
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.peerOn[[2]uintptr{uintptr(a) + 1, uintptr(b) + 1}]
}

// FailEventTimes makes the driver fail to time events
// (cuEventElapsedTime returns CUDA_ERROR_INVALID_HANDLE) until stop is
// called or t ends, and reports whether the tests run on the emulator
// (false: a real GPU, nothing changes).
func FailEventTimes(t testing.TB) (stop func(), ok bool) {
	if !emulated {
		return func() {}, false
	}
	old := drv.cuEventElapsedTime
	var once sync.Once
	stop = func() { once.Do(func() { drv.cuEventElapsedTime = old }) }
	t.Cleanup(stop)
	drv.cuEventElapsedTime = func(*float32, uintptr, uintptr) cuResult { return 400 }
	return stop, true
}
