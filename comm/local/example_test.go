package local_test

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// Four in-process workers sum their gradients with an all-reduce.
func ExampleRun() {
	sums := make([][]float32, 4)
	err := local.Run(context.Background(), 4, func(ctx context.Context, c comm.Communicator) error {
		grad := []float32{float32(c.Rank()), 1}
		if err := c.AllReduce(ctx, comm.Float32s(grad)); err != nil {
			return err
		}
		sums[c.Rank()] = grad
		return nil
	})
	fmt.Println(sums, err)
	// Output: [[6 4] [6 4] [6 4] [6 4]] <nil>
}
