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
