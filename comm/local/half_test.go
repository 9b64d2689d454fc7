package local

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/device"
)

// TestFloat16Collectives checks AllReduce and AllGather of
// comm.Float16s against a plain reference: the canonical order with every
// addition rounded to half (device.AddFloat16), on 1, 2, 3, 5 and 16 ranks
// and lengths 0, 1, 7 and 1001.
func TestFloat16Collectives(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 16} {
		for _, L := range []int{0, 1, 7, 1001} {
			t.Run(fmt.Sprintf("n=%d/L=%d", n, L), func(t *testing.T) {
				in := make([][]uint16, n)
				for r := range in {
					rng := rand.New(rand.NewPCG(uint64(n), uint64(L*64+r)))
					in[r] = make([]uint16, L)
					for i := range in[r] {
						in[r][i] = device.ToFloat16(float32(rng.NormFloat64() * 100))
					}
				}
				want := make([]uint16, L)
				for c := range n {
					lo, hi := comm.ChunkBounds(L, n, c)
					for i := lo; i < hi; i++ {
						s := in[(c+1)%n][i]
						for k := 2; k <= n; k++ {
							s = device.AddFloat16(s, in[(c+k)%n][i])
						}
						want[i] = s
					}
				}
				err := Run(context.Background(), n, func(ctx context.Context, cm comm.Communicator) error {
					r := cm.Rank()
					buf := slices.Clone(in[r])
					if err := cm.AllReduce(ctx, comm.Float16s(buf)); err != nil {
						return err
					}
					if !slices.Equal(buf, want) {
						return fmt.Errorf("rank %d: AllReduce %v, want %v", r, buf, want)
					}
					all := make([]uint16, n*L)
					if err := cm.AllGather(ctx, comm.Float16s(in[r]), comm.Float16s(all)); err != nil {
						return err
					}
					if !slices.Equal(all, slices.Concat(in...)) {
						return fmt.Errorf("rank %d: AllGather differs", r)
					}
					return nil
				})
				if err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}
