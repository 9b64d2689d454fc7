// Package dynlib owns opening a shared library at run time: dlopen through
// purego (no cgo, no headers), the candidate names tried in order or the
// one path an environment variable names, every required symbol checked
// before any is bound, and one error that lists each failure and says how
// to install the library. internal/native/blas (OpenBLAS) and internal/native/dnnl
// (oneDNN) load through it.
package dynlib

import (
	"fmt"
	"os"
	"runtime"
	"strings"

	"github.com/ebitengine/purego"
)

// Library says where a library may be found and what to say when it is not.
type Library struct {
	// Candidates are the file names tried in order.
	Candidates []string
	// Env names an environment variable that, when set, is the one path
	// tried.
	Env string
	// NotFound is the sentinel Open's error wraps.
	NotFound error
	// Install says how to install the library ("install it (Debian/Ubuntu:
	// apt-get install …)").
	Install string
	// KeepOnFailure leaves a library open that use refused (it may have
	// started threads that closing it would pull the code from under).
	KeepOnFailure bool
}

// Open opens the first candidate that use accepts (use gets its path and
// handle; an error refuses it) and returns its path. When none is
// accepted, the error wraps l.NotFound and names every path tried, why
// each failed, how to install the library and l.Env.
func (l Library) Open(use func(path string, h uintptr) error) (string, error) {
	if runtime.GOOS != "linux" && runtime.GOOS != "darwin" && runtime.GOOS != "freebsd" {
		return "", fmt.Errorf("%w: run-time loading is not supported on %s", l.NotFound, runtime.GOOS)
	}
	names := l.Candidates
	if p := os.Getenv(l.Env); p != "" {
		names = []string{p}
	}
	var errs []string
	for _, name := range names {
		h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_LOCAL)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		if err := use(name, h); err != nil {
			if !l.KeepOnFailure {
				purego.Dlclose(h)
			}
			errs = append(errs, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		return name, nil
	}
	return "", fmt.Errorf("%w (tried %s: %s); %s or set %s to its path",
		l.NotFound, strings.Join(names, ", "), strings.Join(errs, "; "), l.Install, l.Env)
}

// Symbol is a function of the library: its name and a pointer to the Go
// function variable it is bound to.
type Symbol struct {
	Name string
	Fn   any
}

// Bind checks that the library h has every symbol and then binds them all:
// when one is missing, none is bound and the error names it.
func Bind(h uintptr, syms ...Symbol) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("binding symbols: %v", r)
		}
	}()
	for _, s := range syms {
		if _, err := purego.Dlsym(h, s.Name); err != nil {
			return fmt.Errorf("symbol %s missing: %w", s.Name, err)
		}
	}
	for _, s := range syms {
		purego.RegisterLibFunc(s.Fn, h, s.Name)
	}
	return nil
}
