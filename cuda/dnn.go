package cuda

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

var cudnn struct {
	create           func(h *uintptr) int32
	destroy          func(h uintptr) int32
	setStream        func(h, s uintptr) int32
	getVersion       func() uint64
	getErrorString   func(st int32) *byte
	createTensor     func(d *uintptr) int32
	destroyTensor    func(d uintptr) int32
	destroyFilter    func(d uintptr) int32
	destroyConv      func(d uintptr) int32
	setTensor4d      func(d uintptr, format, dtype, n, c, h, w int32) int32
	createFilter     func(d *uintptr) int32
	setFilter4d      func(d uintptr, dtype, format, k, c, h, w int32) int32
	createConv       func(d *uintptr) int32
	setConv2d        func(d uintptr, padH, padW, u, v, dilH, dilW, mode, dtype int32) int32
	setConvMath      func(d uintptr, math int32) int32
	fwdAlgo          func(h, x, w, conv, y uintptr, req int32, ret *int32, perf unsafe.Pointer) int32
	fwdWorkspace     func(h, x, w, conv, y uintptr, algo int32, size *uint64) int32
	forward          func(h uintptr, alpha unsafe.Pointer, xd, x, wd, w, conv uintptr, algo int32, ws uintptr, wsSize uint64, beta unsafe.Pointer, yd, y uintptr) int32
	bwdDataAlgo      func(h, w, dy, conv, dx uintptr, req int32, ret *int32, perf unsafe.Pointer) int32
	bwdDataWorkspace func(h, w, dy, conv, dx uintptr, algo int32, size *uint64) int32
	backwardData     func(h uintptr, alpha unsafe.Pointer, wd, w, dyd, dy, conv uintptr, algo int32, ws uintptr, wsSize uint64, beta unsafe.Pointer, dxd, dx uintptr) int32
	bwdFilterAlgo    func(h, x, dy, conv, dw uintptr, req int32, ret *int32, perf unsafe.Pointer) int32
	// The Find functions time every algorithm on the GPU (on memory they
	// allocate themselves) and rank them by time; same arguments as the
	// Get…_v7 heuristics above.
	findFwd            func(h, x, w, conv, y uintptr, req int32, ret *int32, perf unsafe.Pointer) int32
	findBwdData        func(h, w, dy, conv, dx uintptr, req int32, ret *int32, perf unsafe.Pointer) int32
	findBwdFilter      func(h, x, dy, conv, dw uintptr, req int32, ret *int32, perf unsafe.Pointer) int32
	bwdFilterWorkspace func(h, x, dy, conv, dw uintptr, algo int32, size *uint64) int32
	backwardFilter     func(h uintptr, alpha unsafe.Pointer, xd, x, dyd, dy, conv uintptr, algo int32, ws uintptr, wsSize uint64, beta unsafe.Pointer, dwd, dw uintptr) int32
}

var (
	cudnnOnce sync.Once
	cudnnErr  error
)

// cuDNN enums.
const (
	cudnnNCHW          = 0
	cudnnFloat         = 0
	cudnnCrossCorr     = 1
	cudnnDefaultMath   = 0
	cudnnFMAMath       = 3
	cudnnDeterministic = 1
)

func loadCUDNN() error {
	cudnnOnce.Do(func() {
		h, path, err := libCUDNN.open()
		if err != nil {
			cudnnErr = err
			return
		}
		cudnnErr = bind(libCUDNN, path, h, map[string]any{
			"cudnnCreate":                                    &cudnn.create,
			"cudnnDestroy":                                   &cudnn.destroy,
			"cudnnSetStream":                                 &cudnn.setStream,
			"cudnnGetVersion":                                &cudnn.getVersion,
			"cudnnGetErrorString":                            &cudnn.getErrorString,
			"cudnnCreateTensorDescriptor":                    &cudnn.createTensor,
			"cudnnDestroyTensorDescriptor":                   &cudnn.destroyTensor,
			"cudnnDestroyFilterDescriptor":                   &cudnn.destroyFilter,
			"cudnnDestroyConvolutionDescriptor":              &cudnn.destroyConv,
			"cudnnSetTensor4dDescriptor":                     &cudnn.setTensor4d,
			"cudnnCreateFilterDescriptor":                    &cudnn.createFilter,
			"cudnnSetFilter4dDescriptor":                     &cudnn.setFilter4d,
			"cudnnCreateConvolutionDescriptor":               &cudnn.createConv,
			"cudnnSetConvolution2dDescriptor":                &cudnn.setConv2d,
			"cudnnSetConvolutionMathType":                    &cudnn.setConvMath,
			"cudnnGetConvolutionForwardAlgorithm_v7":         &cudnn.fwdAlgo,
			"cudnnGetConvolutionForwardWorkspaceSize":        &cudnn.fwdWorkspace,
			"cudnnConvolutionForward":                        &cudnn.forward,
			"cudnnGetConvolutionBackwardDataAlgorithm_v7":    &cudnn.bwdDataAlgo,
			"cudnnGetConvolutionBackwardDataWorkspaceSize":   &cudnn.bwdDataWorkspace,
			"cudnnConvolutionBackwardData":                   &cudnn.backwardData,
			"cudnnGetConvolutionBackwardFilterAlgorithm_v7":  &cudnn.bwdFilterAlgo,
			"cudnnGetConvolutionBackwardFilterWorkspaceSize": &cudnn.bwdFilterWorkspace,
			"cudnnConvolutionBackwardFilter":                 &cudnn.backwardFilter,
			"cudnnFindConvolutionForwardAlgorithm":           &cudnn.findFwd,
			"cudnnFindConvolutionBackwardDataAlgorithm":      &cudnn.findBwdData,
			"cudnnFindConvolutionBackwardFilterAlgorithm":    &cudnn.findBwdFilter,
		})
		if cudnnErr != nil {
			return
		}
		v := cudnn.getVersion()
		if v < 90000 {
			cudnnErr = fmt.Errorf("cuda: cuDNN %d is too old; install cuDNN 9 (pip install nvidia-cudnn-cu13)", v)
			return
		}
		setLibraryVersion(libCUDNN.what, fmt.Sprintf("%d.%d.%d", v/10000, v%10000/100, v%100))
	})
	return cudnnErr
}

func cudnnError(call string, st int32) error {
	if st == 0 {
		return nil
	}
	if st == missingSymbol {
		return missingError(call)
	}
	return fmt.Errorf("cuda: %s: %s (cuDNN status %d)", call, goString(cudnn.getErrorString(st)), st)
}

// dnnHandle returns the stream's cuDNN handle, bound to the stream (the
// device's context current).
func (s *Stream) dnnHandle() (uintptr, error) {
	if s.dnn != 0 {
		return s.dnn, nil
	}
	if err := loadCUDNN(); err != nil {
		return 0, err
	}
	var h uintptr
	if err := cudnnError("cudnnCreate", cudnn.create(&h)); err != nil {
		return 0, err
	}
	if err := cudnnError("cudnnSetStream", cudnn.setStream(h, s.h)); err != nil { // not kept: destroyed
		return 0, errors.Join(err, cudnnError("cudnnDestroy", cudnn.destroy(h)))
	}
	s.dnn = h
	return h, nil
}

// algoPerf is cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (the three
// have one layout): algo, status, time (ms), memory (bytes), determinism,
// math type, 3 reserved ints.
type algoPerf struct {
	algo, status int32
	time         float32
	_            int32
	memory       uint64
	determinism  int32
	mathType     int32
	_            [3]int32
}

// maxConvWorkspace bounds the scratch of a convolution algorithm: a faster
// algorithm that needs more is passed over.
const maxConvWorkspace = 1 << 30

// pickAlgo returns the first algorithm of a ranked list (cuDNN ranks by
// measured time for Find, by expected speed for the heuristics) that
// succeeded and needs at most maxConvWorkspace of scratch; deterministic
// restricts it to algorithms whose results do not vary between runs.
func pickAlgo(perf []algoPerf, n int32, deterministic bool) (algoPerf, bool) {
	for _, p := range perf[:n] {
		if p.status != 0 || p.memory > maxConvWorkspace {
			continue
		}
		if deterministic && p.determinism != cudnnDeterministic {
			continue
		}
		return p, true
	}
	return algoPerf{}, false
}

// ConvChoice is the algorithm chosen for one convolution of a program.
type ConvChoice struct {
	// Op is the convolution ("conv2d 3×3 s1 p1 fwd" …) and its shapes.
	Op string `json:"op"`
	// Algo is cuDNN's algorithm number and name for the direction.
	Algo     int32  `json:"algo"`
	AlgoName string `json:"algo_name"`
	// Timed says whether cuDNN timed the candidates (Find) or only ranked
	// them (the heuristics, where Find is unavailable).
	Timed bool `json:"timed"`
	// Ms is the chosen algorithm's measured time (Timed only).
	Ms             float32 `json:"ms,omitempty"`
	WorkspaceBytes uint64  `json:"workspace_bytes"`
	Deterministic  bool    `json:"deterministic"`
	// Candidates is how many algorithms cuDNN offered.
	Candidates int `json:"candidates"`
}

// Names of cuDNN's algorithms per direction (cudnnConvolutionFwdAlgo_t,
// …BwdDataAlgo_t, …BwdFilterAlgo_t).
var convAlgoNames = [3][]string{
	{"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"},
	{"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"},
	{"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"},
}

func convAlgoName(dir int, algo int32) string {
	if algo >= 0 && int(algo) < len(convAlgoNames[dir]) {
		return convAlgoNames[dir][algo]
	}
	return fmt.Sprint(algo)
}
