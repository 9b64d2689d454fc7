//go:build !unix

package rundir

// Lock does nothing where flock is not available.
func Lock(dir string) (unlock func(), err error) { return func() {}, nil }
