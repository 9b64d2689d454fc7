package train

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/mpi"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
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

// close releases the GPUs opened (their streams, library handles and
// contexts) once the run is over; a failure is logged.
func (g *gpus) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for o, d := range g.devs {
		if err := d.Close(); err != nil {
			slog.Warn("train: closing the GPU", "gpu", o, "err", err)
		}
		delete(g.devs, o)
	}
}

// checkGPUFits refuses, before anything is allocated, a run whose memory
// on a GPU exceeds the GPU's free memory, as checkFits does on the CPU:
// memoryNeed's parts that live on the GPU (the programs' arenas, the
// vectors) for the workers that share GPU 0 (here of this machine's
// workers: in-process workers and mpirun's local ranks take the GPUs in
// turn). A lower bound: cuDNN's and the reducers' scratch and the CUDA
// context come on top.
func checkGPUFits(c Config, ds *Dataset, here, size int) error {
	n, err := cuda.Count()
	if err != nil || n == 0 {
		return nil // checkDevice says what is missing
	}
	free, total, name, err := cuda.FreeMemory(0)
	if err != nil {
		return fmt.Errorf("train: -device cuda: reading the GPU's free memory: %w", err)
	}
	perGPU := ceilDiv(here, n)
	parts, err := memoryNeed(c, ds, perGPU, size, perGPU, false)
	if err != nil {
		return err
	}
	// The loaders' batches are host memory; each worker on a GPU keeps a
	// model.
	parts = parts[:3]
	for i := range parts[:2] {
		parts[i].what, parts[i].alt = strings.Replace(parts[i].what, "executors)", "workers' models)", 1), ""
	}
	need := totalBytes(parts)
	if need <= int64(free) {
		return nil
	}
	list := largestFirst(parts, need)
	fix := "lower " + parts[0].flag
	if parts[0].flag == "-workers" {
		fix = "use fewer workers per GPU (-workers, or more GPUs)"
	}
	return fmt.Errorf("%w: the run needs at least %s of GPU memory on GPU 0 for its %d worker(s) there (%s), and GPU 0 (%s) has %s free (of %s); %s",
		ErrConfig, gb(need), perGPU, list, name, gb(int64(free)), gb(int64(total)), fix)
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
// share one GPU; a process started by an MPI launcher uses GPU (local
// rank) mod (number of GPUs), the local rank as comm/mpi reads it from
// Open MPI, PMIx, PMI or Slurm.
func (r *runner) exec(rank int) (engine.Backend, error) {
	if r.cfg.Device != "cuda" {
		return engine.CPU, nil
	}
	n, _ := cuda.Count() // at least 1: checked by checkDevice
	local := rank
	if r.backend == "mpi" {
		local = 0
		if l, ok := mpi.Detect(); ok && l.LocalRank >= 0 {
			local = l.LocalRank
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

// useNCCL reports whether workers on GPUs connect over NCCL: -comm nccl,
// or auto where every worker on this machine has a GPU of its own and
// NCCL loads. An error says why -comm nccl cannot be honoured.
func (r *runner) useNCCL() (bool, error) {
	want := r.cfg.Comm
	if r.cfg.Device != "cuda" || (want != "nccl" && want != "auto") {
		return false, nil
	}
	n, err := cuda.Count()
	if err != nil {
		return false, fmt.Errorf("train: -comm %s: %w", want, err)
	}
	// The workers of this job on this machine: the in-process workers, or
	// under mpirun the ranks on this node.
	workers := r.size
	if r.backend == "mpi" {
		workers = 1
		if l, ok := mpi.Detect(); ok {
			workers = max(1, l.LocalSize())
		}
	}
	if workers > n {
		if want == "auto" {
			return false, nil
		}
		return false, fmt.Errorf("%w: -comm nccl needs a GPU per worker (NCCL refuses two ranks on one GPU): %d workers on this machine, %d GPUs; use -comm %s (the workers share the GPUs: in-process workers reduce in the GPUs' memory where they share a GPU or the GPUs have peer access, otherwise device buffers are staged through host memory)",
			ErrConfig, workers, n, map[bool]string{true: "mpi", false: "local"}[r.backend == "mpi"])
	}
	if _, err := cuda.NCCLVersion(); err != nil {
		if want == "auto" {
			return false, nil
		}
		return false, fmt.Errorf("train: -comm nccl: %w", err)
	}
	return true, nil
}

// commOnGPU connects a worker whose vectors are on GPU g to its peers for
// device buffers, as -comm says: NCCL beside host for device buffers
// (comm.Route) when every worker has a GPU of its own, else host with
// device buffers staged through host memory (comm.Staged), except the
// collective calls and SendRecvs of in-process workers on one GPU, or on
// GPUs with peer access, which comm/local runs in the GPUs' memory. Over
// NCCL the
// emulated network (-net-*), if any, wraps the routed communicator
// (netmodel.Emulate): host and device calls take turns on one emulated
// link. It returns the communicator, the backend's name and the NCCL
// communicator to close (nil without NCCL).
func (r *runner) commOnGPU(ctx context.Context, host comm.Communicator, g *cuda.Device) (comm.Communicator, string, *cuda.NCCL, error) {
	nccl, err := r.useNCCL()
	if err != nil {
		return nil, "", nil, err
	}
	if !nccl {
		return comm.Staged(host), r.backend, nil, nil
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
	if err == nil && r.netOverNCCL != nil {
		c, err = netmodel.Emulate(c, *r.netOverNCCL)
	}
	if err != nil {
		nc.Close()
		return nil, "", nil, err
	}
	return c, "nccl", nc, nil
}
