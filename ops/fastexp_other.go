//go:build !amd64

package ops

// useAVX2 is false off amd64: the Go code computes the exponentials.
var useAVX2 = false

func expSubSum8(x []float32, sub float32) float64 { panic("ops: no AVX2") }

func expSubScale8(dst, x []float32, sub float32, k, spread float64) { panic("ops: no AVX2") }
