package cuda

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ebitengine/purego"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// TestBindToleratesMissingSymbols: a function the library file lacks does
// not fail the loading; calling it is an error that names it, and the
// library's record lists it. (libc stands in for an NVIDIA library.)
func TestBindToleratesMissingSymbols(t *testing.T) {
	h, err := purego.Dlopen("libc.so.6", purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		t.Fatal(err)
	}
	var getpid func() int32
	var absent func(x int32, p *int32) int32
	lib := library{what: "libc (test)"}
	if err := bind(lib, "libc.so.6", h, map[string]any{"getpid": &getpid, "sparsegrad_no_such_function": &absent}); err != nil {
		t.Fatalf("a missing symbol failed the whole library: %v", err)
	}
	if getpid() <= 0 {
		t.Fatal("getpid was not bound")
	}
	r := absent(1, nil)
	if r != missingSymbol {
		t.Fatalf("the stub returned %d, want %d", r, missingSymbol)
	}
	for _, err := range []error{cudnnError("sparsegrad_no_such_function", r), cublasError("sparsegrad_no_such_function", r), ncclCheck("sparsegrad_no_such_function", r), check("sparsegrad_no_such_function", cuResult(r))} {
		if err == nil || !strings.Contains(err.Error(), "sparsegrad_no_such_function") || !strings.Contains(err.Error(), "too old") {
			t.Errorf("calling the missing function: %v", err)
		}
	}
	loaded, _ := Libraries()
	i := slices.IndexFunc(loaded, func(l LibraryInfo) bool { return l.Name == lib.what })
	if i < 0 || loaded[i].Path != "libc.so.6" || !slices.Equal(loaded[i].Missing, []string{"sparsegrad_no_such_function"}) {
		t.Fatalf("the library's record: %+v", loaded)
	}
}

// TestCuDNNCompanionsByPattern: cuDNN 9's sub-libraries are found by
// pattern, so sub-libraries that newer releases add are loaded too; the
// front library and other major versions are not companions.
func TestCuDNNCompanionsByPattern(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"libcudnn.so.9", "libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9.10.2", "libcudnn_added_in_9_20.so.9", "libcudnn_cnn.so.8", "libcublas.so.13"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	for _, p := range libCUDNN.companions(dir) {
		got = append(got, filepath.Base(p))
	}
	want := []string{"libcudnn_added_in_9_20.so.9", "libcudnn_engines_precompiled.so.9.10.2", "libcudnn_graph.so.9"}
	if !slices.Equal(got, want) {
		t.Fatalf("companions %v, want %v", got, want)
	}
}

// TestLibrariesReportsNVRTC: the report of loaded libraries names NVRTC,
// its version and its file, and the file is among those mapped into the
// process (NVRTC runs without a GPU; CI installs it).
func TestLibrariesReportsNVRTC(t *testing.T) {
	major, minor, err := NVRTCVersion()
	testenv.Check(t, testenv.NVRTC, err, "no NVRTC")
	loaded, files := Libraries()
	i := slices.IndexFunc(loaded, func(l LibraryInfo) bool { return l.Name == libNVRTC.what })
	if i < 0 {
		t.Fatalf("NVRTC is not in %+v", loaded)
	}
	if want := fmt.Sprintf("%d.%d", major, minor); loaded[i].Version != want {
		t.Errorf("NVRTC's version %q, want %q", loaded[i].Version, want)
	}
	if !slices.ContainsFunc(files, func(f string) bool { return strings.HasPrefix(filepath.Base(f), "libnvrtc") }) {
		t.Errorf("no libnvrtc among the mapped files %v", files)
	}
	t.Logf("NVRTC %s from %s; mapped: %v", loaded[i].Version, loaded[i].Path, files)
}

func TestModuleVersion(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27 07:09:45 UTC 2025\nGCC version:  gcc version 12.2.0\n", "580.65.06"},
		// The open kernel modules (the H200 machine of 2026-11-26).
		{"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (dvs-builder@U22-I3-AM02-24-3)  Thu Nov 13 2025\n", "580.159.04"},
		{"NVRM version: NVIDIA UNIX Open Kernel Module for x86_64\n580.1\n", ""},
		{"", ""},
		{"garbage", ""},
	} {
		if got := moduleVersion(c.in); got != c.want {
			t.Errorf("moduleVersion(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
