package train

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
	"github.com/sparsegrad/sparsegrad/comm/mpi"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/cuda"
	"github.com/sparsegrad/sparsegrad/engine"
	"github.com/sparsegrad/sparsegrad/metrics"
	"github.com/sparsegrad/sparsegrad/models"
	"github.com/sparsegrad/sparsegrad/ops"
	"github.com/sparsegrad/sparsegrad/rundir"
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
	// ended (also after an error or an interruption). Its errors are
	// logged and printed as warnings; they do not stop training, but the
	// report.html there (of an earlier state of the run) is removed.
	Report func(runDir string) error
	// Comm, when set, makes this process one worker of that communicator
	// instead of starting Config.Workers in-process workers or detecting
	// mpirun (for tests and embedding).
	Comm comm.Communicator
	// LossSink, when set, receives rank 0's per-step mean loss (tests).
	LossSink func(step int, loss float64)
	// Stop, when closed, stops the run after the current step, with a
	// checkpoint; Run then returns an error wrapping ErrInterrupted.
	Stop <-chan struct{}
	// Signals makes SIGINT and SIGTERM stop the run as Stop does (a
	// second one ends the process at once), for commands.
	Signals bool
	// Given names the command-line flags that were given (without the
	// dash). With Config.Resume, the configuration comes from the run's
	// run.json, and only the given flags change it (where a resumed run may
	// change it) or contradict it (an error). Nil means every field of the
	// Config that is not zero was given.
	Given map[string]bool
	// wrapModel, when set, replaces each worker's model by what it returns
	// (tests: models that fail or panic).
	wrapModel func(models.Model) models.Model
}

// RunInfo is the content of run.json (metrics.Run defines it, for its
// readers too).
type RunInfo = metrics.Run[Config, cuda.Report]

// Run trains as c says. Without Options.Comm it starts c.Workers workers in
// this process over comm/local, or, when this process runs under mpirun, one
// worker over comm/mpi. It returns when training ends, when ctx is cancelled
// or when Options.Stop (or a signal, see Options.Signals) stops it. With
// c.Resume it continues the run in that folder from its newest complete
// checkpoint, configured by the run's run.json (see Options.Given).
//
// Its errors carry one "train: " prefix. The error of a job that started
// training says what happened, at which step, the last checkpoint and the
// command that resumes; under mpirun it is printed by rank 0 only (the
// others' errors say Reported).
func Run(ctx context.Context, c Config, o Options) (err error) {
	_, launched := mpi.Detect() // by an MPI launcher
	underMPI := o.Comm == nil && launched
	defer func() { err = finalError(err) }()
	var prev *RunInfo
	if c.Resume != "" {
		if underMPI {
			return runMPI(ctx, c, o, nil)
		}
		if c, prev, err = resumeConfig(c, o.Given, false); err != nil {
			return err
		}
		if err := checkNotComplete(c.Defaults(), progOf(o)); err != nil {
			return err
		}
	}
	r, err := prepare(ctx, c, o, underMPI)
	if err != nil {
		return err
	}
	r.prev = prev
	defer r.gpus.close()
	switch {
	case o.Comm != nil:
		r.backend, r.size = "given", o.Comm.Size()
		defer r.watchStop()()
		return r.discard(r.worker(ctx, o.Comm), o.Comm.Rank() == 0)
	case underMPI:
		return runMPI(ctx, c, o, r)
	default:
		r.backend, r.size = "local", r.cfg.Workers.Value()
		r.sim = simulated(r.cfg, r.backend, r.size)
		var opts []local.Option
		net, err := r.hostNetwork()
		if err != nil {
			return err
		}
		if net != nil {
			opts = append(opts, local.WithNetwork(*net))
		}
		defer r.watchStop()()
		return r.discard(local.Run(ctx, r.cfg.Workers.Value(), r.worker, opts...), true)
	}
}

// runMPI runs this process's worker under mpirun. With r nil (a resume) the
// configuration is resolved first: rank 0 reads the run's run.json and
// broadcasts the result, so the other ranks need no copy of it (no shared
// file system). Errors every rank returns at the same point (an agreed
// stop, a failed checkpoint, a refused resume) end every rank normally;
// other errors abort the job (mpi.Run).
func runMPI(ctx context.Context, c Config, o Options, r *runner) error {
	var agreed error
	err := mpi.Run(ctx, func(ctx context.Context, cm comm.Communicator) error {
		if r == nil {
			var err error
			if r, err = prepareResumeMPI(ctx, cm, c, o); err != nil {
				if cm.Rank() == 0 {
					fmt.Fprintln(os.Stderr, finalError(err))
				}
				agreed = reported{err}
				return nil
			}
		}
		r.backend, r.size = "mpi", cm.Size()
		// The same emulated network as simulated workers get, between the
		// processes.
		net, err := r.hostNetwork()
		if err != nil {
			return err
		}
		if net != nil {
			if cm, err = netmodel.Emulate(cm, *net); err != nil {
				return fmt.Errorf("%w: emulated network: %w", ErrConfig, err)
			}
		}
		defer r.watchStop()()
		err = r.discard(r.worker(ctx, cm), cm.Rank() == 0)
		var ce collectiveError
		if errors.As(err, &ce) {
			// Rank 0 says it now: mpirun may kill the job before Run
			// returns (after Ctrl-C it does within seconds).
			if cm.Rank() == 0 {
				fmt.Fprintln(r.opt.Progress, finalError(err))
			}
			agreed = reported{err}
			return nil
		}
		return err
	})
	if err != nil {
		return err
	}
	return agreed
}

// prepareResumeMPI resolves a resume's configuration on rank 0 and
// broadcasts it (or rank 0's error), then prepares the run on every rank.
func prepareResumeMPI(ctx context.Context, cm comm.Communicator, c Config, o Options) (*runner, error) {
	var b []byte
	var rerr error
	var prev *RunInfo
	if cm.Rank() == 0 {
		var rc Config
		if rc, prev, rerr = resumeConfig(c, o.Given, true); rerr == nil {
			rerr = checkNotComplete(rc.Defaults(), mpiLauncher(cm.Size())+" "+progOf(o))
		}
		if rerr == nil {
			b, rerr = json.Marshal(rc)
		}
		if rerr != nil {
			b = []byte(errString(rerr))
		}
	}
	st := comm.Int64s{0}
	if rerr != nil {
		st[0] = 1
	}
	if err := cm.Broadcast(ctx, st, 0); err != nil {
		return nil, err
	}
	b, err := broadcastBytes(ctx, cm, b, 0)
	if err != nil {
		return nil, err
	}
	if st[0] != 0 {
		if cm.Rank() == 0 {
			return nil, rerr
		}
		return nil, reported{fmt.Errorf("%w: %s", ErrConfig, b)}
	}
	var rc Config
	if err := json.Unmarshal(b, &rc); err != nil {
		return nil, fmt.Errorf("resuming: the configuration rank 0 sent: %w", err)
	}
	r, err := prepare(ctx, rc, o, true)
	if err != nil {
		return nil, err
	}
	r.prev = prev
	return r, nil
}

// prepare checks the configuration and loads the data of a run.
func prepare(ctx context.Context, c Config, o Options, underMPI bool) (*runner, error) {
	c, err := ReplayDefaults(c, underMPI)
	if err != nil {
		return nil, err
	}
	c = c.Defaults()
	if err := c.Validate(underMPI); err != nil {
		return nil, err
	}
	if c.Out == "" {
		c.Out = c.Resume
	}
	if err := checkFreshOut(c, o, underMPI); err != nil {
		return nil, err
	}
	if err := checkDevice(c); err != nil {
		return nil, err
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Progress == nil {
		o.Progress = os.Stderr
	}
	// The run's size: this process's workers, the job's processes on this
	// machine (mpirun) and the job's workers.
	workers, local, size := c.Workers.Value(), 1, c.Workers.Value()
	var sim *simulation
	switch {
	case o.Comm != nil:
		workers, size = 1, o.Comm.Size()
	case underMPI:
		workers, size = 1, 1
		l, ok := mpi.Detect()
		if ok && l.Size > 0 {
			size = l.Size
		}
		local = size
		if v := l.LocalSize(); ok && v > 0 { // any launcher's, as -comm auto reads it
			local = v
		}
	default:
		sim = simulated(c, "local", workers)
	}
	// Workers sharing this machine share its cores. The default BLAS thread
	// count depends only on that number, so that -workers N and mpirun -np N
	// on one machine use the same count: OpenBLAS's results depend on it.
	threads := c.BLASThreads
	if threads == 0 {
		threads = max(1, runtime.NumCPU()/(workers*local))
	}
	blasDesc, err := ops.ConfigureBLAS(c.BLAS, threads)
	if err != nil {
		return nil, fmt.Errorf("-blas %s: %w", c.BLAS, err)
	}
	// The CPU's convolution and batch-norm kernels, with the same thread
	// count: oneDNN's results depend on it too.
	var kernelsDesc string
	if c.Device != "cuda" {
		if kernelsDesc, err = engine.ConfigureCPU(c.Kernels, threads); err != nil {
			return nil, fmt.Errorf("-kernels %s: %w", c.Kernels, err)
		}
	}
	ds, err := LoadDataset(ctx, c)
	if err != nil {
		return nil, err
	}
	// Size the run before anything of it is allocated or written.
	if err := checkFits(c, ds, workers, local, size, sim); err != nil {
		return nil, err
	}
	r := &runner{cfg: c, opt: o, ds: ds, blas: blasDesc, kernels: kernelsDesc, start: time.Now()}
	if c.Resume == "" {
		_, serr := os.Stat(c.Out)
		r.created = errors.Is(serr, os.ErrNotExist)
	}
	return r, nil
}

// watchStop starts what makes the run stop on request (Options.Stop,
// Options.Signals) and returns the function that ends it.
func (r *runner) watchStop() func() {
	stop := make(chan struct{})
	r.stop = stop
	var undo []func()
	if r.opt.Signals {
		rank0 := true
		if l, ok := mpi.Detect(); ok && r.backend == "mpi" {
			rank0 = l.Rank == 0
		}
		undo = append(undo, r.handleSignals(stop, r.opt.Progress, rank0))
	}
	return func() {
		for _, u := range undo {
			u()
		}
	}
}

// hostNetwork is the emulated network (-net-*) the run's host backend
// applies (nil: none). Over NCCL it is r.netOverNCCL instead, which each
// worker applies to its routed communicator (commOnGPU).
func (r *runner) hostNetwork() (*netmodel.Network, error) {
	if r.cfg.NetBandwidth <= 0 {
		return nil, nil
	}
	net := netmodel.Network{Latency: r.cfg.NetLatency, Bandwidth: r.cfg.NetBandwidth}
	if err := net.Validate(); err != nil {
		return nil, fmt.Errorf("%w: emulated network: %w", ErrConfig, err)
	}
	nccl, err := r.useNCCL()
	if err != nil || !nccl {
		return &net, err
	}
	r.netOverNCCL = &net
	return nil, nil
}

// reported is an error of a rank other than 0 under mpirun that rank 0
// reports for the job.
type reported struct{ error }

func (e reported) Unwrap() error { return e.error }

// Reported reports whether err is one that another process of the job
// (rank 0 under mpirun) prints: the caller exits non-zero without printing
// it again.
func Reported(err error) bool {
	var r reported
	return errors.As(err, &r)
}

// finalError gives Run's error one "train: " prefix, and the error of a
// job that started training its own message (jobError), not the
// in-process backend's "rank N:" around it.
func finalError(err error) error {
	if err == nil {
		return nil
	}
	var je *jobError
	if errors.As(err, &je) {
		if Reported(err) {
			return reported{je}
		}
		return je
	}
	msg := onePrefix(err)
	msg = localRank.ReplaceAllString(msg, "")
	return &prefixed{msg: "train: " + msg, err: err}
}

// localRank matches the "rank N: " comm/local puts before a worker's error.
var localRank = regexp.MustCompile(`^rank \d+: `)

// prefixed is an error with its message rewritten.
type prefixed struct {
	msg string
	err error
}

func (e *prefixed) Error() string { return e.msg }
func (e *prefixed) Unwrap() error { return e.err }

type runner struct {
	cfg     Config
	opt     Options
	ds      *Dataset
	blas    string
	kernels string // the CPU kernels' description ("" on GPUs)
	backend string
	size    int // the job's ranks
	start   time.Time
	gpus    gpus
	// prev is the run.json of the run being resumed.
	prev *RunInfo
	// stop is closed when the run is asked to stop (watchStop);
	// stopOnce closes it once.
	stop     chan struct{}
	stopOnce sync.Once
	// status is what messages about the job say of it.
	status runStatus
	// sim is what simulated workers share (nil unless several in-process
	// workers run on the CPU).
	sim *simulation
	// netOverNCCL is the emulated network (-net-*) when the workers
	// connect over NCCL: each applies it to its routed communicator
	// (commOnGPU), so that the device's calls and the host's share one
	// emulated link; nil when the host's backend applies it (or none).
	netOverNCCL *netmodel.Network
	// created says that this process found no -out folder (a new run
	// creates it); kept that a worker of this process has something worth
	// keeping (worker.kept), panicked that one panicked (its log is
	// kept): see discard.
	created        bool
	kept, panicked atomic.Bool
}

// discard removes, when the run ended with err before it had anything
// worth keeping, what this process wrote for it (rundir.Discard; rank0 says
// that the process holds rank 0), and returns err. A new run that fails
// before its first step so leaves nothing behind, and the same command
// starts it again; a refused resume has written nothing in the first
// place. It runs once per process, after its workers have returned.
func (r *runner) discard(err error, rank0 bool) error {
	if err != nil && r.cfg.Resume == "" && !r.kept.Load() && !r.panicked.Load() {
		rundir.Discard(r.cfg.Out, rank0, r.created)
	}
	return err
}

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
	return configError(rundir.CheckFresh(c.Out))
}
