//go:build !(darwin || freebsd || linux || netbsd)

package mpi

import (
	"fmt"
	"runtime"
)

func dlopen(name string) (uintptr, error) {
	return 0, fmt.Errorf("loading shared libraries at run time is not supported on %s; the MPI backend needs Linux (or another Unix)", runtime.GOOS)
}

func dlsym(h uintptr, name string) (uintptr, error) {
	return 0, fmt.Errorf("no dlsym on %s", runtime.GOOS)
}
