//go:build darwin || freebsd || linux || netbsd

package mpi

import "github.com/ebitengine/purego"

// dlopen opens a shared library with RTLD_NOW|RTLD_GLOBAL: Open MPI's plugins
// (mca_*.so) resolve their symbols against libmpi and libopen-pal, which must
// therefore be global.
func dlopen(name string) (uintptr, error) {
	return purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
}

func dlsym(h uintptr, name string) (uintptr, error) { return purego.Dlsym(h, name) }
