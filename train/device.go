package train

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/engine"
)

// gpus are the GPUs this process has opened, by ordinal, shared by its
// in-process workers, and the NCCL unique id of its in-process workers.
type gpus struct {
	mu   sync.Mutex
	devs map[int]*cuda.Device

	idOnce sync.Once
	id     cuda.NCCLID
	idErr  error
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
		d, err := r.gpus.open(local%n, cuda.Options{TF32: r.cfg.TF32, Deterministic: r.cfg.Deterministic})
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

// localGPUs returns the GPUs of this machine and the workers of this job on
// it: the in-process workers, or under mpirun the ranks on this node.
func (r *runner) localGPUs() (gpus, workers int, err error) {
	if gpus, err = cuda.Count(); err != nil {
		return 0, 0, err
	}
	workers = r.size
	if r.backend == "mpi" {
		workers = 1
		if v, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_LOCAL_SIZE")); err == nil {
			workers = v
		}
	}
	return gpus, workers, nil
}

// commOnGPU connects a worker whose vectors are on GPU g to its peers for
// device buffers, as -comm says: NCCL beside host for device buffers
// (comm.Route) when every worker has a GPU of its own, else host with
// device buffers staged through host memory (comm.Staged). It returns the
// communicator, the backend's name and the NCCL communicator to close (nil
// without NCCL).
func (r *runner) commOnGPU(ctx context.Context, host comm.Communicator, g *cuda.Device) (comm.Communicator, string, *cuda.NCCL, error) {
	staged := func() (comm.Communicator, string, *cuda.NCCL, error) { return comm.Staged(host), r.backend, nil, nil }
	want := r.cfg.Comm
	if want != "nccl" && want != "auto" {
		return staged()
	}
	n, workers, err := r.localGPUs()
	if err != nil {
		return nil, "", nil, fmt.Errorf("train: -comm %s: %w", want, err)
	}
	if workers > n {
		if want == "auto" {
			return staged()
		}
		return nil, "", nil, fmt.Errorf("%w: -comm nccl needs a GPU per worker (NCCL refuses two ranks on one GPU): %d workers on this machine, %d GPUs; use -comm %s (the workers share the GPUs, device buffers staged through host memory)",
			ErrConfig, workers, n, map[bool]string{true: "mpi", false: "local"}[r.backend == "mpi"])
	}
	if _, err := cuda.NCCLVersion(); err != nil {
		if want == "auto" {
			return staged()
		}
		return nil, "", nil, fmt.Errorf("train: -comm nccl: %w", err)
	}
	// The unique id: one per process in-process, rank 0's over the host
	// communicator under mpirun.
	var id cuda.NCCLID
	if r.backend == "mpi" {
		var b []byte // empty when rank 0 has no id: every rank fails
		var idErr error
		if host.Rank() == 0 {
			if id, idErr = cuda.NewNCCLID(); idErr == nil {
				b = id[:]
			}
		}
		if b, err = broadcastBytes(ctx, host, b, 0); err != nil {
			return nil, "", nil, fmt.Errorf("train: -comm nccl: sending the NCCL id: %w", err)
		}
		if idErr != nil {
			return nil, "", nil, fmt.Errorf("train: -comm nccl: %w", idErr)
		}
		if len(b) != len(id) {
			return nil, "", nil, fmt.Errorf("train: -comm nccl: rank 0 could not create an NCCL id (see its log)")
		}
		copy(id[:], b)
	} else {
		r.gpus.idOnce.Do(func() { r.gpus.id, r.gpus.idErr = cuda.NewNCCLID() })
		if id, err = r.gpus.id, r.gpus.idErr; err != nil {
			return nil, "", nil, fmt.Errorf("train: -comm nccl: %w", err)
		}
	}
	nc, err := cuda.NewNCCL(ctx, g, id, host.Rank(), host.Size())
	if err != nil {
		return nil, "", nil, fmt.Errorf("train: -comm nccl: %w", err)
	}
	c, err := comm.Route(host, nc)
	if err != nil {
		nc.Close()
		return nil, "", nil, err
	}
	return c, "nccl", nc, nil
}
