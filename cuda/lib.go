package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/ebitengine/purego"
	"github.com/sparsegrad/sparsegrad/device"
)

// EnvLibs names the environment variable with extra directories (colon-
// separated) searched first for the NVIDIA libraries.
const EnvLibs = "SPARSEGRAD_CUDA_LIBS"

// library describes one shared library and how to install it.
type library struct {
	what    string   // "the CUDA driver"
	names   []string // sonames, most preferred first
	prefix  string   // file name prefix for directory scans ("libcublas.so.")
	preload []string // prefixes of companion libraries loaded first from the same directory
	install string
}

var (
	libCUDA = library{what: "the CUDA driver (libcuda)", names: []string{"libcuda.so.1", "libcuda.so"}, prefix: "libcuda.so",
		install: "install the NVIDIA driver for your GPU (it provides libcuda.so.1), e.g. Debian/Ubuntu: apt-get install nvidia-driver"}
	libNVRTC = library{what: "NVRTC, the CUDA runtime compiler", names: []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"}, prefix: "libnvrtc.so",
		preload: []string{"libnvrtc-builtins.so"},
		install: "install the CUDA toolkit or the pip wheel nvidia-cuda-nvrtc (pip install nvidia-cuda-nvrtc), or set " + EnvLibs}
	libCUBLAS = library{what: "cuBLAS", names: []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so.11", "libcublas.so"}, prefix: "libcublas.so",
		preload: []string{"libcublasLt.so"},
		install: "install the CUDA toolkit or the pip wheel nvidia-cublas (pip install nvidia-cublas), or set " + EnvLibs}
	libCUDNN = library{what: "cuDNN 9", names: []string{"libcudnn.so.9"}, prefix: "libcudnn.so.9",
		preload: []string{"libcudnn_graph.so.9", "libcudnn_engines_precompiled.so.9", "libcudnn_engines_runtime_compiled.so.9", "libcudnn_heuristic.so.9", "libcudnn_ops.so.9", "libcudnn_cnn.so.9", "libcudnn_adv.so.9"},
		install: "install the pip wheel nvidia-cudnn-cu13 (or -cu12 for CUDA 12), or cuDNN 9 from NVIDIA, or set " + EnvLibs}
)

// searchDirs lists the directories searched after the system's library
// path, in order.
func searchDirs() []string {
	var dirs []string
	for _, d := range strings.Split(os.Getenv(EnvLibs), ":") {
		if d != "" {
			dirs = append(dirs, d)
		}
	}
	dirs = append(dirs, "/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/x86_64-linux-gnu", "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib")
	var roots []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if v := os.Getenv(env); v != "" {
			roots = append(roots, v)
		}
	}
	if h, err := os.UserHomeDir(); err == nil {
		roots = append(roots, filepath.Join(h, ".local"))
	}
	venvs, _ := filepath.Glob("/opt/*/.venv")
	roots = append(roots, venvs...)
	roots = append(roots, "/usr/local", "/usr", "/opt/conda")
	for _, r := range roots {
		for _, pat := range []string{"lib/python3*/site-packages/nvidia/*/lib", "lib/python3*/dist-packages/nvidia/*/lib", "lib/python3/dist-packages/nvidia/*/lib"} {
			m, _ := filepath.Glob(filepath.Join(r, pat))
			sort.Strings(m)
			dirs = append(dirs, m...)
		}
	}
	return slices.Compact(dirs)
}

// open loads lib: from EnvLibs' directories, by soname from the system's
// library path, then from the other search directories. Companion libraries
// of the same directory are loaded first (globally), so that the library
// finds them when it loads them by name (cuDNN 9's sub-libraries, cuBLASLt,
// NVRTC's builtins).
func (lib library) open() (handle uintptr, path string, err error) {
	if runtime.GOOS != "linux" {
		return 0, "", fmt.Errorf("%w: %s: only Linux is supported", device.ErrUnavailable, lib.what)
	}
	var tried []string
	tryDir := func(dir string) (uintptr, string, bool) {
		for _, name := range lib.names {
			p := filepath.Join(dir, name)
			if _, err := os.Stat(p); err != nil {
				continue
			}
			lib.preloadFrom(dir)
			h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
			if err != nil {
				tried = append(tried, err.Error())
				continue
			}
			return h, p, true
		}
		return 0, "", false
	}
	env := strings.Split(os.Getenv(EnvLibs), ":")
	for _, d := range env {
		if d == "" {
			continue
		}
		if h, p, ok := tryDir(d); ok {
			return h, p, nil
		}
	}
	for _, name := range lib.names {
		h, err := purego.Dlopen(name, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, name, nil
		}
		tried = append(tried, err.Error())
	}
	for _, d := range searchDirs() {
		if h, p, ok := tryDir(d); ok {
			return h, p, nil
		}
	}
	msg := "not found on the library path, in " + EnvLibs + ", or in the driver, toolkit and pip-wheel folders"
	if len(tried) > 0 {
		msg = strings.Join(tried[:min(len(tried), 3)], "; ")
	}
	return 0, "", fmt.Errorf("%w: %s could not be loaded (%s); %s", device.ErrUnavailable, lib.what, msg, lib.install)
}

// preloadFrom loads the companion libraries found in dir, ignoring
// failures (the main library reports what it still misses).
func (lib library) preloadFrom(dir string) {
	for _, pre := range lib.preload {
		m, _ := filepath.Glob(filepath.Join(dir, pre+"*"))
		sort.Strings(m)
		for _, p := range m {
			purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		}
	}
}

// bind registers every function pointer in fns (name → pointer to a Go
// function variable) from library handle h.
func bind(what string, h uintptr, fns map[string]any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: binding symbols: %v", device.ErrUnavailable, what, r)
		}
	}()
	names := make([]string, 0, len(fns))
	for n := range fns {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if _, err := purego.Dlsym(h, n); err != nil {
			return fmt.Errorf("%w: %s lacks %s (too old a version?): %v", device.ErrUnavailable, what, n, err)
		}
		purego.RegisterLibFunc(fns[n], h, n)
	}
	return nil
}

// once-loaded libraries, shared by every device of the process.
var (
	driverOnce sync.Once
	driverErr  error
)

// errNoGPU is returned when the driver loads but finds no device.
var errNoGPU = errors.New("no CUDA-capable GPU is visible")
