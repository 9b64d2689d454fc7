//go:build unix

package data

import (
	"syscall"
	"time"
)

// cpuTime returns the CPU time (user + system) this process has used, so
// benchmarks can report throughput per CPU second, which other load on a
// shared machine does not distort as much as wall time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
