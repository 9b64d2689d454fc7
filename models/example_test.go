package models_test

import (
	"context"
	"fmt"

	"github.com/sparsegrad/sparsegrad/device"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/ops"
)

// A training loop's use of a model: build it for a batch size (on the CPU
// by default), own the parameter and gradient vectors, run a step into the
// gradient, update the parameters, evaluate.
func Example() {
	if _, err := ops.ConfigureBLAS(ops.BLASAuto, 0); err != nil { // OpenBLAS if installed
		panic(err)
	}
	m, err := models.NewNCF(models.PaperNCF(4, 5, 3))
	if err != nil {
		panic(err)
	}
	params := make([]float32, m.NumParams())
	if err := m.InitParams(params); err != nil {
		panic(err)
	}
	grad := make([]float32, m.NumParams())
	// The hook learns when each tensor's gradient is final (backward order).
	var order []string
	lay := m.Layout()
	m.SetGradHook(func(i int, _ device.Event) { order = append(order, lay[i].Name) })
	b := models.Batch{Users: []int{0, 1, 3}, Items: []int{4, 2, 0}, Targets: []float32{1, 0, 1}}
	if _, err := m.TrainStep(context.Background(), b, device.Host(params), device.Host(grad)); err != nil {
		panic(err)
	}
	for i := range params {
		params[i] -= 0.1 * grad[i] // plain SGD
	}
	ev, err := m.Evaluate(context.Background(), models.Batch{Users: []int{2}, Items: []int{1}}, device.Host(params))
	if err != nil {
		panic(err)
	}
	fmt.Println(m.NumParams(), len(lay), lay[0].Name, lay[0].Shape)
	fmt.Println("first final gradient:", order[0], "last:", order[len(order)-1])
	fmt.Println(len(ev.Scores), "score")
	// Output:
	// 3121 12 mf_user_embed.weight [4 8]
	// first final gradient: final.weight last: mlp_user_embed.weight
	// 1 score
}
