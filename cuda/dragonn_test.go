package cuda_test

import (
	"math/big"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/sparsify"
)

// pcgBefore returns the PCG state whose next step is (hi, lo): the
// inverse of the LCG's s ← mul·s + inc modulo 2^128.
func pcgBefore(hi, lo uint64) (uint64, uint64) {
	word := func(h, l uint64) *big.Int {
		return new(big.Int).Add(new(big.Int).Lsh(new(big.Int).SetUint64(h), 64), new(big.Int).SetUint64(l))
	}
	mod := new(big.Int).Lsh(big.NewInt(1), 128)
	mul := word(2549297995355413924, 4865540595714422341)
	inc := word(6364136223846793005, 1442695040888963407)
	s := new(big.Int).Sub(word(hi, lo), inc)
	s.Mul(s, new(big.Int).ModInverse(mul, mod)).Mod(s, mod)
	return new(big.Int).Rsh(s, 64).Uint64(), new(big.Int).And(s, new(big.Int).SetUint64(^uint64(0))).Uint64()
}

// TestGPUDragonnSamples checks DRAGONN's sample positions drawn on the
// GPU (the method's kernel k_dragonn_samples) against math/rand/v2's
// IntN over the same PCG on the host, for numbers of elements that are
// powers of two and not, one draw and many; and that a draw IntN would
// reject (an output of 0 for 3 elements, from a state built for it) is
// flagged, on the GPU as by the kernel's host function.
func TestGPUDragonnSamples(t *testing.T) {
	d := gpu(t)
	m, ok := sparsify.Lookup("dragonn")
	if !ok {
		t.Fatal("no dragonn")
	}
	var k *device.Kernel
	for _, kk := range m.Kernels {
		if kk.Name == "k_dragonn_samples" {
			k = kk
		}
	}
	if k == nil {
		t.Fatal("dragonn has no kernel k_dragonn_samples")
	}
	s, err := d.NewStream()
	if err != nil {
		t.Fatal(err)
	}
	ops := d.Sparse()
	draw := func(ns int, hi, lo uint64, numel int) ([]int32, int32) {
		pos, err := d.Alloc(device.Int32, ns)
		if err != nil {
			t.Fatal(err)
		}
		flag, err := d.Alloc(device.Int32, 1)
		if err != nil {
			t.Fatal(err)
		}
		if err := ops.Run(s, k, ns, pos, int64(ns), int64(hi), int64(lo), int64(numel), flag); err != nil {
			t.Fatal(err)
		}
		got, f := make([]int32, ns), make([]int32, 1)
		if err := s.Copy(device.Host(got), pos); err != nil {
			t.Fatal(err)
		}
		if err := s.Copy(device.Host(f), flag); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		return got, f[0]
	}
	for _, numel := range []int{1, 2, 3, 5, 1000, 1 << 20, 1<<31 - 1} {
		for _, ns := range []int{1, 7, 5000} {
			hi, lo := uint64(numel)*0x9e3779b97f4a7c15, uint64(ns)
			rng := rand.New(rand.NewPCG(hi, lo))
			want := make([]int32, ns)
			for j := range want {
				want[j] = int32(rng.IntN(numel))
			}
			got, flag := draw(ns, hi, lo, numel)
			if flag != 0 || !slices.Equal(got, want) {
				i := 0
				for i < ns && got[i] == want[i] {
					i++
				}
				t.Fatalf("numel %d, %d draws: flag %d, first difference at %d of IntN's", numel, ns, flag, i)
			}
		}
	}
	// The first output is 0 from a state whose next step has high word 0;
	// for 3 elements IntN rejects it.
	hi, lo := pcgBefore(0, 12345)
	if x := rand.NewPCG(hi, lo).Uint64(); x != 0 {
		t.Fatalf("the built state's first output is %d, want 0", x)
	}
	if _, flag := draw(4, hi, lo, 3); flag != 1 {
		t.Errorf("a draw IntN rejects: flag %d on the GPU, want 1", flag)
	}
	hpos, hflag := make([]int32, 4), make([]int32, 1)
	k.Host(4, device.Host(hpos), int64(4), int64(hi), int64(lo), int64(3), device.Host(hflag))
	if hflag[0] != 1 {
		t.Errorf("a draw IntN rejects: flag %d from the host function, want 1", hflag[0])
	}
}
