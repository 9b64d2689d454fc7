package local

import (
	"bytes"
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// FuzzAllGatherVCounts drives AllGatherV with arbitrary worker counts and
// (possibly invalid) counts: valid calls must match the reference (the
// ranks' blocks concatenated), invalid ones must fail with an error on every
// rank, and nothing may panic or hang.
func FuzzAllGatherVCounts(f *testing.F) {
	f.Add(uint8(3), []byte{1, 2, 3}, uint64(1))
	f.Add(uint8(1), []byte{0}, uint64(2))
	f.Add(uint8(5), []byte{0, 0, 7, 0, 1}, uint64(3))
	f.Add(uint8(2), []byte{200, 1}, uint64(4)) // 200 decodes as a negative count
	f.Add(uint8(4), []byte{1, 1}, uint64(5))   // too few counts
	f.Fuzz(func(t *testing.T, nb uint8, raw []byte, seed uint64) {
		n := int(nb%8) + 1
		counts := make([]int, len(raw))
		valid := len(raw) == n
		total := 0
		for i, v := range raw {
			counts[i] = int(int8(v)) // negative values are invalid counts
			if counts[i] < 0 {
				valid = false
			}
			total += max(counts[i], 0)
		}
		rng := rand.New(rand.NewPCG(seed, 0))
		in := make([]comm.Buffer, n)
		for r := range in {
			own := 0
			if r < len(counts) && counts[r] > 0 {
				own = counts[r]
			}
			in[r] = randBuf(comm.Float32, own, rng)
		}
		gathered := make([]comm.Buffer, n)
		errs := make([]error, n)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = Run(ctx, n, func(ctx context.Context, c comm.Communicator) error {
			r := c.Rank()
			gathered[r] = newBuf(comm.Float32, total)
			errs[r] = c.AllGatherV(ctx, in[r], gathered[r], counts)
			return nil
		})
		if !valid {
			for r, err := range errs {
				if err == nil {
					t.Fatalf("rank %d: counts %v on %d ranks accepted", r, counts, n)
				}
			}
			return
		}
		var want []byte
		for _, b := range in {
			want = append(want, b.Bytes()...)
		}
		for r := range n {
			if errs[r] != nil {
				t.Fatalf("rank %d: %v", r, errs[r])
			}
			if !bytes.Equal(gathered[r].Bytes(), want) {
				t.Fatalf("rank %d: all-gather-v differs from the ranks' blocks concatenated", r)
			}
		}
	})
}
