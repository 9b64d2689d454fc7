//go:build !linux

package mpi

// osYield is a no-op where sched_yield is not wired up; the engine still
// yields its goroutine.
func osYield() {}
