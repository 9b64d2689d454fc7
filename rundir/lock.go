//go:build unix

package rundir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Lock takes the run folder's lock (an exclusive flock on dir/.lock,
// which holds the owner's pid), so that two processes never write one run:
// a -resume of a run that is still training, or two commands with one
// -out. It returns the function that releases it, which also removes
// dir/.lock, so that a finished run's folder holds only its results. The
// lock ends with the process, also when it is killed (the file then stays
// behind, unlocked, and the next run takes it). A folder in use is refused
// (ErrRefused).
//
// Removing the file while others may be opening it is safe because a lock
// counts only when it is held on the file that dir/.lock names: the owner
// removes the file before it unlocks, and whoever locks a file that is no
// longer dir/.lock (it was removed meanwhile) lets it go and tries again.
func Lock(dir string) (unlock func(), err error) {
	p := filepath.Join(dir, lockFile)
	for {
		f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("locking the run directory: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			b := make([]byte, 32)
			n, _ := f.ReadAt(b, 0)
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				who := "another train process"
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b[:n]))); perr == nil {
					who += fmt.Sprintf(" (pid %d)", pid)
				}
				return nil, refuse("%s is in use by %s; wait for it to end or stop it (Ctrl-C) before resuming", dir, who)
			}
			return nil, fmt.Errorf("locking the run directory: %w", err)
		}
		if !sameFile(f, p) {
			// Its owner removed it after we opened it: not the lock.
			f.Close()
			continue
		}
		f.Truncate(0)
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		return func() {
			os.Remove(p)
			syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
			f.Close()
		}, nil
	}
}

// sameFile reports whether the open file f is the file at path p.
func sameFile(f *os.File, p string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(p)
	return err == nil && os.SameFile(a, b)
}

// Held reports whether a process holds dir's lock (Lock): whether the run
// in dir is being trained now. A run.json that says the run is running
// while no process holds the lock belongs to a run that was killed.
func Held(dir string) bool {
	f, err := os.Open(filepath.Join(dir, lockFile))
	if err != nil {
		return false // no lock file: nobody holds it
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); err != nil {
		return errors.Is(err, syscall.EWOULDBLOCK)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false
}
