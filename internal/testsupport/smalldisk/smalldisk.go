//go:build linux

// Package smalldisk gives tests a real file system that fills up: a tmpfs
// of a few megabytes mounted on a temporary folder, whose writes fail with
// ENOSPC ("no space left on device") as those of a full disk do. Mounting
// needs root (CI runs as root). Without it a test skips, or fails when
// SPARSEGRAD_REQUIRE names smalldisk (internal/testsupport/testenv; CI does), so that
// the full-disk tests never pass silently without a full disk.
package smalldisk

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// Mount mounts a tmpfs of size bytes (rounded up to pages) on a new
// temporary folder and returns the folder; the test's cleanup unmounts it.
func Mount(t testing.TB, size int64) string {
	t.Helper()
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, fmt.Sprintf("size=%d", size)); err != nil {
		testenv.Missing(t, testenv.SmallDisk, fmt.Sprintf("cannot mount a %d-byte tmpfs on %s (%v): mounting needs root", size, dir, err))
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
