package train

import (
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/engine"
)

// gpus are the GPUs this process has opened, by ordinal, shared by its
// in-process workers.
type gpus struct {
	mu   sync.Mutex
	devs map[int]*cuda.Device
}

// open returns GPU ordinal, opening it on first use.
func (g *gpus) open(ordinal int, opts cuda.Options) (*cuda.Device, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if d, ok := g.devs[ordinal]; ok {
		return d, nil
	}
	d, err := cuda.Open(ordinal, opts)
	if err != nil {
		return nil, err
	}
	if g.devs == nil {
		g.devs = map[int]*cuda.Device{}
	}
	g.devs[ordinal] = d
	return d, nil
}

// checkDevice fails early, before data is loaded, when the device the run
// asks for cannot be used: for -device cuda, a missing driver or GPU.
func checkDevice(c Config) error {
	if c.Device != "cuda" {
		return nil
	}
	n, err := cuda.Count()
	if err != nil {
		return fmt.Errorf("train: -device cuda: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("train: -device cuda: the CUDA driver sees no GPU on this machine; check nvidia-smi and CUDA_VISIBLE_DEVICES, or use -device cpu")
	}
	return nil
}

// exec returns the engine backend the worker of the given rank runs its
// model on, as Config.Device says. On a GPU, in-process worker r uses GPU
// r mod (number of GPUs) and a stream of its own, so several workers may
// share one GPU; a process started by mpirun uses GPU (local rank) mod
// (number of GPUs).
func (r *runner) exec(rank int) (engine.Backend, error) {
	switch r.cfg.Device {
	case "cpu":
		return engine.CPU, nil
	case "cuda":
		if err := checkDevice(r.cfg); err != nil {
			return nil, err
		}
		n, _ := cuda.Count()
		local := rank
		if r.backend == "mpi" {
			local = 0
			if v, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_LOCAL_RANK")); err == nil {
				local = v
			}
		}
		d, err := r.gpus.open(local%n, cuda.Options{TF32: r.cfg.TF32})
		if err != nil {
			return nil, fmt.Errorf("train: -device cuda: %w", err)
		}
		be, err := cuda.NewBackend(d)
		if err != nil {
			return nil, fmt.Errorf("train: -device cuda: %w", err)
		}
		return be, nil
	}
	return nil, fmt.Errorf("%w: unknown -device %q; use cpu or cuda", ErrConfig, r.cfg.Device)
}
