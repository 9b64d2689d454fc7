package cuda

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
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
	// cuDNN 9 is a front library and sub-libraries (graph, engines,
	// heuristics, ops, cnn, adv, and more in newer releases), all
	// libcudnn_*.so.9*.
	libCUDNN = library{what: "cuDNN 9", names: []string{"libcudnn.so.9"}, prefix: "libcudnn.so.9",
		preload: []string{"libcudnn_*.so.9"},
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

// companions returns the companion libraries of lib in dir: the files
// matching each preload pattern (with any suffix), sorted.
func (lib library) companions(dir string) []string {
	var files []string
	for _, pre := range lib.preload {
		m, _ := filepath.Glob(filepath.Join(dir, pre+"*"))
		sort.Strings(m)
		files = append(files, m...)
	}
	return files
}

// preloadFrom loads the companion libraries found in dir, in two passes
// so that one that needs another loaded later still loads, ignoring
// failures (the main library reports what it still misses).
func (lib library) preloadFrom(dir string) {
	var failed []string
	for _, p := range lib.companions(dir) {
		if _, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL); err != nil {
			failed = append(failed, p)
		}
	}
	for _, p := range failed {
		purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	}
}

// missingSymbol is what a function the loaded library lacks returns when
// called (every bound function returns a status first): the error helpers
// of each library turn it into an error naming the call.
const missingSymbol = -7700

// missingError is the error of a call to a function the library lacks.
func missingError(call string) error {
	return fmt.Errorf("cuda: %s: the loaded library has no such function (too old a version?); install a newer one or set %s", call, EnvLibs)
}

// bind registers every function pointer in fns (name → pointer to a Go
// function variable) from library lib, loaded from path as handle h. A
// function the file lacks does not fail the loading (a run may never call
// it): it becomes a stub that returns missingSymbol, and the library's
// record lists it (Libraries).
func bind(lib library, path string, h uintptr, fns map[string]any) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s: binding symbols: %v", device.ErrUnavailable, lib.what, r)
		}
	}()
	names := make([]string, 0, len(fns))
	for n := range fns {
		names = append(names, n)
	}
	sort.Strings(names)
	var missing []string
	for _, n := range names {
		if _, err := purego.Dlsym(h, n); err != nil {
			missing = append(missing, n)
			stub(fns[n])
			continue
		}
		purego.RegisterLibFunc(fns[n], h, n)
	}
	recordLibrary(lib.what, path, missing)
	return nil
}

// stub makes *fn (a pointer to a function variable) a function that
// returns missingSymbol as its first result (zero values otherwise).
func stub(fn any) {
	v := reflect.ValueOf(fn).Elem()
	t := v.Type()
	v.Set(reflect.MakeFunc(t, func([]reflect.Value) []reflect.Value {
		out := make([]reflect.Value, t.NumOut())
		for i := range out {
			out[i] = reflect.Zero(t.Out(i))
		}
		if t.NumOut() > 0 {
			switch k := t.Out(0).Kind(); {
			case k >= reflect.Int && k <= reflect.Int64:
				out[0] = reflect.ValueOf(int64(missingSymbol)).Convert(t.Out(0))
			}
		}
		return out
	}))
}

// LibraryInfo describes one NVIDIA library the process has loaded.
type LibraryInfo struct {
	// Name says which library ("cuDNN 9").
	Name string `json:"name"`
	// Version is the version the library reports ("9.10.2").
	Version string `json:"version,omitempty"`
	// Path is the file it was loaded from (a soname when the system's
	// library path found it).
	Path string `json:"path"`
	// Missing lists the functions the package binds that the file lacks:
	// calling one is an error naming it.
	Missing []string `json:"missing,omitempty"`
}

var (
	libsMu sync.Mutex
	libs   []LibraryInfo
)

func recordLibrary(what, path string, missing []string) {
	libsMu.Lock()
	defer libsMu.Unlock()
	for i := range libs {
		if libs[i].Name == what {
			libs[i].Path = path
			libs[i].Missing = append(libs[i].Missing, missing...)
			return
		}
	}
	libs = append(libs, LibraryInfo{Name: what, Path: path, Missing: missing})
}

func setLibraryVersion(what, version string) {
	libsMu.Lock()
	defer libsMu.Unlock()
	for i := range libs {
		if libs[i].Name == what {
			libs[i].Version = version
		}
	}
}

// Libraries returns the NVIDIA libraries the package has loaded so far
// (the driver, NVRTC, cuBLAS, cuDNN, NCCL: each once first used), with
// their versions, and every NVIDIA library file mapped into the process
// (from /proc/self/maps: also the companions the libraries load
// themselves, such as cuDNN's sub-libraries and cuBLASLt), resolved to
// real paths.
func Libraries() (loaded []LibraryInfo, files []string) {
	libsMu.Lock()
	loaded = slices.Clone(libs)
	libsMu.Unlock()
	b, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		return loaded, nil
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 {
			continue
		}
		p := f[len(f)-1]
		base := filepath.Base(p)
		if !strings.Contains(base, ".so") || !isNVIDIALibrary(base) || seen[p] {
			continue
		}
		seen[p] = true
		files = append(files, p)
	}
	sort.Strings(files)
	return loaded, files
}

// isNVIDIALibrary reports whether a file name is one of NVIDIA's CUDA
// libraries.
func isNVIDIALibrary(base string) bool {
	for _, p := range []string{"libcuda.", "libnvrtc", "libcublas", "libcudnn", "libnccl", "libnvJitLink", "libnvidia-", "libcudart"} {
		if strings.HasPrefix(base, p) {
			return true
		}
	}
	return false
}

// once-loaded libraries, shared by every device of the process.
var (
	driverOnce sync.Once
	driverErr  error
)

// errNoGPU is returned when the driver loads but finds no device.
var errNoGPU = errors.New("no CUDA-capable GPU is visible")
