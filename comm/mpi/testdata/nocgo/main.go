// Command nocgo is built by TestMPIRunWithoutCgo with CGO_ENABLED=0: it checks
// that a binary without cgo loads Open MPI and sums in the canonical order.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/mpi"
)

func main() {
	ctx := context.Background()
	err := mpi.Run(ctx, func(ctx context.Context, c comm.Communicator) error {
		x := make(comm.Float32s, 1000)
		for i := range x {
			x[i] = float32(c.Rank()+1) * 0.5
		}
		if err := c.AllReduce(ctx, x); err != nil {
			return err
		}
		n := c.Size()
		if want := float32(n*(n+1)) * 0.25; x[0] != want || x[999] != want {
			return fmt.Errorf("sum %v, want %v", x[0], want)
		}
		fmt.Printf("NOCGO-OK rank %d of %d\n", c.Rank(), n)
		return nil
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
