package cuda

import (
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"

	"github.com/sparsegrad/sparsegrad/device"
)

// kernelSource is the CUDA C of every kernel of the package.
//
//go:embed kernels.cu
var kernelSource string

var nvrtc struct {
	nvrtcVersion           func(major, minor *int32) int32
	nvrtcCreateProgram     func(p *uintptr, src, name *byte, nh int32, headers, includes unsafe.Pointer) int32
	nvrtcDestroyProgram    func(p *uintptr) int32
	nvrtcCompileProgram    func(p uintptr, nopt int32, opts unsafe.Pointer) int32
	nvrtcGetProgramLogSize func(p uintptr, n *uint64) int32
	nvrtcGetProgramLog     func(p uintptr, log *byte) int32
	nvrtcGetCUBINSize      func(p uintptr, n *uint64) int32
	nvrtcGetCUBIN          func(p uintptr, b *byte) int32
	nvrtcGetPTXSize        func(p uintptr, n *uint64) int32
	nvrtcGetPTX            func(p uintptr, b *byte) int32
	nvrtcGetErrorString    func(r int32) *byte
	path                   string
}

var (
	nvrtcOnce sync.Once
	nvrtcErr  error
)

// loadNVRTC loads NVRTC once per process.
func loadNVRTC() error {
	nvrtcOnce.Do(func() {
		h, path, err := libNVRTC.open()
		if err != nil {
			nvrtcErr = err
			return
		}
		nvrtc.path = path
		nvrtcErr = bind(libNVRTC, path, h, map[string]any{
			"nvrtcVersion":           &nvrtc.nvrtcVersion,
			"nvrtcCreateProgram":     &nvrtc.nvrtcCreateProgram,
			"nvrtcDestroyProgram":    &nvrtc.nvrtcDestroyProgram,
			"nvrtcCompileProgram":    &nvrtc.nvrtcCompileProgram,
			"nvrtcGetProgramLogSize": &nvrtc.nvrtcGetProgramLogSize,
			"nvrtcGetProgramLog":     &nvrtc.nvrtcGetProgramLog,
			"nvrtcGetCUBINSize":      &nvrtc.nvrtcGetCUBINSize,
			"nvrtcGetCUBIN":          &nvrtc.nvrtcGetCUBIN,
			"nvrtcGetPTXSize":        &nvrtc.nvrtcGetPTXSize,
			"nvrtcGetPTX":            &nvrtc.nvrtcGetPTX,
			"nvrtcGetErrorString":    &nvrtc.nvrtcGetErrorString,
		})
		var a, b int32
		if nvrtcErr == nil && nvrtc.nvrtcVersion(&a, &b) == 0 {
			setLibraryVersion(libNVRTC.what, fmt.Sprintf("%d.%d", a, b))
		}
	})
	return nvrtcErr
}

// NVRTCVersion returns the version of the NVRTC library the package loads
// (an error wrapping device.ErrUnavailable when there is none).
func NVRTCVersion() (major, minor int, err error) {
	if err := loadNVRTC(); err != nil {
		return 0, 0, err
	}
	var a, b int32
	nvrtc.nvrtcVersion(&a, &b)
	return int(a), int(b), nil
}

func nvrtcError(call string, r int32) error {
	if r == 0 {
		return nil
	}
	if r == missingSymbol {
		return missingError(call)
	}
	return fmt.Errorf("cuda: %s: %s (NVRTC %d)", call, goString(nvrtc.nvrtcGetErrorString(r)), r)
}

// Compile compiles CUDA C source for a GPU of compute capability
// major.minor: machine code (cubin) for that GPU when NVRTC knows it, PTX
// for the driver to compile otherwise. The result is cached on disk (in
// the user cache directory, key: source, options, architecture and NVRTC
// version), so each binary compiles its kernels once per GPU model. It
// needs no GPU, only NVRTC.
func Compile(source string, major, minor int) (image []byte, cubin bool, err error) {
	if err := loadNVRTC(); err != nil {
		return nil, false, err
	}
	nmaj, nmin, _ := NVRTCVersion()
	opts := []string{"-default-device", "-std=c++14", "--fmad=false", "-DNDEBUG"}
	key := cacheKey(source, opts, major, minor, nmaj, nmin)
	if img, isCubin, ok := readCache(key); ok {
		return img, isCubin, nil
	}
	// Machine code for the exact GPU; PTX for its virtual architecture when
	// NVRTC predates the GPU.
	image, err = compileOnce(source, append(opts, fmt.Sprintf("-arch=sm_%d%d", major, minor)), true)
	cubin = true
	if err != nil && strings.Contains(err.Error(), "invalid value for --gpu-architecture") {
		image, err = compileOnce(source, append(opts, fmt.Sprintf("-arch=compute_%d%d", major, minor)), false)
		cubin = false
	}
	if err != nil {
		return nil, false, err
	}
	writeCache(key, image, cubin)
	return image, cubin, nil
}

func compileOnce(source string, opts []string, cubin bool) ([]byte, error) {
	var prog uintptr
	if err := nvrtcError("nvrtcCreateProgram", nvrtc.nvrtcCreateProgram(&prog, cString(source), cString("sparsegrad.cu"), 0, nil, nil)); err != nil {
		return nil, err
	}
	defer nvrtc.nvrtcDestroyProgram(&prog)
	cs := make([]*byte, len(opts))
	for i, o := range opts {
		cs[i] = cString(o)
	}
	r := nvrtc.nvrtcCompileProgram(prog, int32(len(cs)), unsafe.Pointer(&cs[0]))
	if r != 0 {
		var n uint64
		nvrtc.nvrtcGetProgramLogSize(prog, &n)
		log := make([]byte, n+1)
		nvrtc.nvrtcGetProgramLog(prog, &log[0])
		return nil, fmt.Errorf("cuda: compiling the kernels with %v: %w:\n%s", opts, nvrtcError("nvrtcCompileProgram", r), strings.TrimRight(string(log[:n]), "\x00\n"))
	}
	var n uint64
	var out []byte
	if cubin {
		if err := nvrtcError("nvrtcGetCUBINSize", nvrtc.nvrtcGetCUBINSize(prog, &n)); err != nil {
			return nil, err
		}
		out = make([]byte, n)
		if err := nvrtcError("nvrtcGetCUBIN", nvrtc.nvrtcGetCUBIN(prog, &out[0])); err != nil {
			return nil, err
		}
		return out, nil
	}
	if err := nvrtcError("nvrtcGetPTXSize", nvrtc.nvrtcGetPTXSize(prog, &n)); err != nil {
		return nil, err
	}
	out = make([]byte, n)
	if err := nvrtcError("nvrtcGetPTX", nvrtc.nvrtcGetPTX(prog, &out[0])); err != nil {
		return nil, err
	}
	return out, nil
}

func cacheKey(source string, opts []string, major, minor, nmaj, nmin int) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%v\x00sm_%d%d\x00nvrtc %d.%d", source, opts, major, minor, nmaj, nmin)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

func cacheDir() string {
	d, err := os.UserCacheDir()
	if err != nil {
		d = os.TempDir()
	}
	return filepath.Join(d, "sparsegrad", "cuda")
}

func readCache(key string) ([]byte, bool, bool) {
	for _, ext := range []string{".cubin", ".ptx"} {
		b, err := os.ReadFile(filepath.Join(cacheDir(), key+ext))
		if err == nil && len(b) > 0 {
			return b, ext == ".cubin", true
		}
	}
	return nil, false, false
}

// writeCache stores an image atomically; failures only cost a recompile.
func writeCache(key string, image []byte, cubin bool) {
	dir := cacheDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return
	}
	ext := ".ptx"
	if cubin {
		ext = ".cubin"
	}
	f, err := os.CreateTemp(dir, key+".tmp*")
	if err != nil {
		return
	}
	_, werr := f.Write(image)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(f.Name())
		return
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, key+ext)); err != nil {
		os.Remove(f.Name())
	}
}

// errNoCompiler wraps a missing NVRTC with what the GPU path needs it for.
func errNoCompiler(err error) error {
	return fmt.Errorf("%w (the GPU kernels are compiled at run time)", err)
}

var _ = device.ErrUnavailable
