//go:build !unix

package train

// lockRun does nothing where flock is not available.
func lockRun(dir string) (func(), error) { return func() {}, nil }
