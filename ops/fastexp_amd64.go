package ops

import "golang.org/x/sys/cpu"

// useAVX2 says that the eight-lane exponentials of fastexp_amd64.s run.
var useAVX2 = cpu.X86.HasAVX2

// expSubSum8 is expSubSum's eight running sums over x (len(x) a multiple
// of 8), added in expSubSum's order.
//
//go:noescape
func expSubSum8(x []float32, sub float32) float64

// expSubScale8 is expSubScale over x (len(x) a multiple of 8, len(dst) at
// least len(x)).
//
//go:noescape
func expSubScale8(dst, x []float32, sub float32, k, spread float64)
