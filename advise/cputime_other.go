//go:build !unix

package advise

import "time"

// processCPU is 0 where the process's CPU time is not read: StepCores stays
// unknown.
func processCPU() time.Duration { return 0 }
