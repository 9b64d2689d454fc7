//go:build unix

package rundir

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// TestLockExcludes: the lock file is removed on every unlock, and yet
// two holders never overlap while processes (here: goroutines with open
// files of their own) keep taking and releasing it.
func TestLockExcludes(t *testing.T) {
	dir := t.TempDir()
	var holders, overlaps, taken atomic.Int32
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 500 {
				unlock, err := Lock(dir)
				if err != nil {
					if !errors.Is(err, ErrRefused) {
						t.Error(err)
						return
					}
					continue
				}
				if holders.Add(1) > 1 {
					overlaps.Add(1)
				}
				taken.Add(1)
				runtime.Gosched()
				holders.Add(-1)
				unlock()
			}
		}()
	}
	wg.Wait()
	if overlaps.Load() > 0 {
		t.Fatalf("two holders of the lock at once, %d times", overlaps.Load())
	}
	if taken.Load() == 0 {
		t.Fatal("the lock was never taken")
	}
	if _, err := os.Stat(filepath.Join(dir, ".lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf(".lock left after the last unlock (stat: %v)", err)
	}
}

// TestHeld: Held tells a held lock from a released one, from a lock file a
// killed process left behind (unlocked) and from no lock file at all.
func TestHeld(t *testing.T) {
	dir := t.TempDir()
	if Held(dir) {
		t.Fatal("Held without a lock file")
	}
	unlock, err := Lock(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !Held(dir) {
		t.Error("Held is false while the lock is held")
	}
	if _, err := Lock(dir); !errors.Is(err, ErrRefused) {
		t.Errorf("Held released the holder's lock: a second Lock gave %v", err)
	}
	unlock()
	if Held(dir) {
		t.Error("Held after unlock")
	}
	// A killed holder leaves the file, unlocked.
	if err := os.WriteFile(filepath.Join(dir, ".lock"), []byte("12345\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if Held(dir) {
		t.Error("Held for a lock file nobody holds")
	}
}
