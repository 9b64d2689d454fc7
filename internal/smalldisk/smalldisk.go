//go:build linux

// Package smalldisk gives tests a real file system that fills up: a tmpfs
// of a few megabytes mounted on a temporary folder, whose writes fail with
// ENOSPC ("no space left on device") as those of a full disk do. Mounting
// needs root (CI runs as root). Without it a test skips, or fails when the
// environment variable SPARSEGRAD_SMALLDISK=require (CI sets it), so that
// the full-disk tests never pass silently without a full disk.
package smalldisk

import (
	"fmt"
	"os"
	"syscall"
	"testing"
)

// Env is the environment variable of the switch; Require its value that
// makes a failed mount fail the test.
const (
	Env     = "SPARSEGRAD_SMALLDISK"
	Require = "require"
)

// Mount mounts a tmpfs of size bytes (rounded up to pages) on a new
// temporary folder and returns the folder; the test's cleanup unmounts it.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	switch v := os.Getenv(Env); v {
	case "", Require:
	default:
		t.Fatalf("%s=%q is not a valid setting: use %s=%s to make a missing small disk fail, or leave it unset to skip", Env, v, Env, Require)
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d", size)); err != nil {
		msg := fmt.Sprintf("cannot mount a %d-byte tmpfs on %s (%v): mounting needs root", size, dir, err)
		if os.Getenv(Env) == Require {
			t.Fatalf("%s, and %s=%s", msg, Env, Require)
		}
		t.Skipf("skipping: %s; set %s=%s to make this a failure", msg, Env, Require)
	}
	t.Cleanup(func() {
		if err := syscall.Unmount(dir, syscall.MNT_DETACH); err != nil {
			t.Errorf("unmounting the small disk %s: %v", dir, err)
		}
	})
	return dir
}

// Fill writes a file of zeros into dir until the file system is full, and
// returns its path (removing it makes room again).
func Fill(t testing.TB, dir string) string {
	t.Helper()
	p := dir + "/filler"
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if pe, ok := err.(*os.PathError); ok && pe.Err == syscall.ENOSPC {
				return p
			}
			t.Fatalf("filling %s: %v", dir, err)
		}
	}
}
