//go:build !unix

package rundir

// Lock does nothing where flock is not available.
func Lock(dir string) (unlock func(), err error) { return func() {}, nil }

// Held reports false where flock is not available: no run is known to be
// training.
func Held(dir string) bool { return false }
