package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/mpi"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/ops"
)

// Options are the parts of a run that are not configuration.
type Options struct {
	// Stdout receives rank 0's progress lines (nil: os.Stdout).
	Stdout io.Writer
	// Progress receives rank 0's progress bars (nil: os.Stderr); bars are
	// drawn only when it is a terminal.
	Progress io.Writer
	// CommandLine is recorded in run.json.
	CommandLine []string
	// Report, when set, writes runDir/report.html (reports.WriteRun). Rank
	// 0 calls it off the training path: from a goroutine of its own after
	// every epoch (never two calls at once; epochs that end during a call
	// give one more call, not one each), and once more when training has
	// ended (also after an error, not after an interruption). Its errors are
	// logged and printed as warnings; they do not stop training.
	Report func(runDir string) error
	// Comm, when set, makes this process one worker of that communicator
	// instead of starting Config.Workers in-process workers or detecting
	// mpirun (for tests and embedding).
	Comm comm.Communicator
	// LossSink, when set, receives rank 0's per-step mean loss (tests).
	LossSink func(step int, loss float64)
	// wrapModel, when set, replaces each worker's model by what it returns
	// (tests: models that fail or panic).
	wrapModel func(models.Model) models.Model
}

// RunInfo is the content of run.json.
type RunInfo struct {
	Config      Config    `json:"config"`
	CommandLine []string  `json:"command_line"`
	Start       time.Time `json:"start"`
	Backend     string    `json:"backend"`
	Workers     int       `json:"workers"`
	Params      int       `json:"params"`
	Tensors     int       `json:"tensors"`
	Pipelined   bool      `json:"pipelined"`
	// Device is where rank 0's model ran ("cpu", or the GPU, e.g.
	// "cuda:0 (NVIDIA H100 80GB HBM3, …)").
	Device   string   `json:"device"`
	Versions Versions `json:"versions"`
	Machine  Machine  `json:"machine"`
	Resumed  string   `json:"resumed_from,omitempty"`
	// LayerNames are the layout's tensor names, in order.
	LayerNames []string `json:"layer_names"`
}

// Versions are the software versions of a run.
type Versions struct {
	Go       string `json:"go"`
	Module   string `json:"module"`
	Revision string `json:"revision,omitempty"`
	BLAS     string `json:"blas"`
	MPI      string `json:"mpi,omitempty"`
}

// Machine describes the computer of rank 0.
type Machine struct {
	Hostname string  `json:"hostname"`
	OS       string  `json:"os"`
	Arch     string  `json:"arch"`
	Cores    int     `json:"cores"`
	CPU      string  `json:"cpu"`
	GPU      string  `json:"gpu"`
	Load1    float64 `json:"load1,omitempty"`
}

// UnderMPI reports whether this process was started by an MPI launcher.
func UnderMPI() bool {
	_, ok := mpi.Detect()
	return ok
}

// Run trains as c says. Without Options.Comm it starts c.Workers workers in
// this process over comm/local, or, when this process runs under mpirun, one
// worker over comm/mpi. It returns when training ends or ctx is cancelled.
func Run(ctx context.Context, c Config, o Options) error {
	c = c.Defaults()
	underMPI := o.Comm == nil && UnderMPI()
	if err := c.Validate(underMPI); err != nil {
		return err
	}
	if c.Out == "" {
		c.Out = c.Resume
	}
	if err := checkFreshOut(c, o, underMPI); err != nil {
		return err
	}
	if err := checkDevice(c); err != nil {
		return err
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	// Workers sharing this machine share its cores. The default BLAS thread
	// count depends only on that number, so that -workers N and mpirun -np N
	// on one machine use the same count: OpenBLAS's results depend on it.
	workersHere := c.Workers.Value()
	if o.Comm != nil {
		workersHere = 1
	} else if underMPI {
		workersHere = 1
		if l, ok := mpi.Detect(); ok && l.Size > 0 {
			workersHere = l.Size
		}
		if v, err := strconv.Atoi(os.Getenv("OMPI_COMM_WORLD_LOCAL_SIZE")); err == nil && v > 0 {
			workersHere = v
		}
	}
	threads := c.BLASThreads
	if threads == 0 {
		threads = max(1, runtime.NumCPU()/workersHere)
	}
	blasDesc, err := ops.ConfigureBLAS(c.BLAS, threads)
	if err != nil {
		return fmt.Errorf("train: -blas %s: %w", c.BLAS, err)
	}
	ds, err := LoadDataset(ctx, c)
	if err != nil {
		return err
	}
	r := &runner{cfg: c, opt: o, ds: ds, blas: blasDesc, start: time.Now()}
	switch {
	case o.Comm != nil:
		r.backend = "given"
		return r.worker(ctx, o.Comm)
	case underMPI:
		r.backend = "mpi"
		return mpi.Run(ctx, r.worker)
	default:
		r.backend = "local"
		var opts []local.Option
		if c.NetBandwidth > 0 {
			net := netmodel.Network{Latency: c.NetLatency, Bandwidth: c.NetBandwidth}
			if err := net.Validate(); err != nil {
				return fmt.Errorf("%w: emulated network: %w", ErrConfig, err)
			}
			opts = append(opts, local.WithNetwork(net))
		}
		return local.Run(ctx, c.Workers.Value(), r.worker, opts...)
	}
}

type runner struct {
	cfg     Config
	opt     Options
	ds      *Dataset
	blas    string
	backend string
	start   time.Time
	gpus    gpus
}

func machine() Machine {
	m := Machine{OS: runtime.GOOS, Arch: runtime.GOARCH, Cores: runtime.NumCPU()}
	m.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				if i := strings.IndexByte(l, ':'); i >= 0 {
					m.CPU = strings.TrimSpace(l[i+1:])
				}
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Sscan(string(b), &m.Load1)
	}
	return m
}

func versions(blas string) Versions {
	v := Versions{Go: runtime.Version(), BLAS: blas}
	if bi, ok := debug.ReadBuildInfo(); ok {
		v.Module = bi.Main.Path + "@" + bi.Main.Version
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" {
				v.Revision = s.Value
			}
		}
	}
	return v
}

// writeJSONAtomic writes v as indented JSON to path via a temporary file.
func writeJSONAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// rankLogger returns a logger writing to runDir/logs/rank-N.log.
func rankLogger(runDir string, rank int) (*slog.Logger, io.Closer, error) {
	dir := filepath.Join(runDir, "logs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, fmt.Errorf("train: creating %s: %w", dir, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("rank-%d.log", rank)), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("train: opening the log of rank %d: %w", rank, err)
	}
	return slog.New(slog.NewTextHandler(f, nil)).With("rank", rank), f, nil
}

var errStop = errors.New("train: stop")

// checkFreshOut refuses to start a new run in a directory that already holds
// one, so that a repeated command never overwrites earlier results. Only the
// rank that writes run.json checks (the others could see the file it has just
// written).
func checkFreshOut(c Config, o Options, underMPI bool) error {
	if c.Resume != "" {
		return nil
	}
	switch {
	case o.Comm != nil:
		if o.Comm.Rank() != 0 {
			return nil
		}
	case underMPI:
		if l, ok := mpi.Detect(); ok && l.Rank != 0 {
			return nil
		}
	}
	if _, err := os.Stat(filepath.Join(c.Out, "run.json")); err == nil {
		return fmt.Errorf("%w: -out %s already holds a run (run.json); pass another -out, continue it with -resume %s, or delete the folder", ErrConfig, c.Out, c.Out)
	}
	return nil
}
