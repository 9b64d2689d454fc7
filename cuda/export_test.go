package cuda

import "testing"

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
