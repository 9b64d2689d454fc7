// Package mpi owns the Open MPI backend of package comm: a Communicator for
// processes started by Open MPI's mpirun (or srun, or another PMIx/PMI
// launcher running Open MPI), with launcher detection from the environment.
//
// The library is loaded at run time with dlopen (through
// github.com/ebitengine/purego, so no MPI headers, no cgo and no build tag are
// needed: a plain `go build`, even with CGO_ENABLED=0, gives a binary that
// works under `mpirun -np N`). It tries libmpi.so.40 (Open MPI 4 and 5), then
// libmpi.so; the environment variable SPARSEGRAD_LIBMPI (LibEnv) names
// another file. Only the Open MPI ABI is supported: its handles are the
// addresses of exported globals such as ompi_mpi_comm_world.
//
// # Threads and progress
//
// One goroutine, locked to its OS thread, makes every MPI call of the process
// (MPI_THREAD_FUNNELED). Calls are queued to it and started in submission
// order with non-blocking MPI primitives, so several non-blocking operations
// progress together; a blocking call is a non-blocking one plus Wait. The
// goroutine polls MPI while operations are active (MPI moves data only inside
// its calls); it sleeps briefly after 5 ms without progress unless a library
// collective or a large message is in flight, and it yields its core
// (sched_yield) when mpirun reports the node oversubscribed.
// Collectives use a duplicate of MPI_COMM_WORLD, user point-to-point messages
// another, so they never match each other.
//
// # Deterministic sums
//
// The all-reduce is a pipelined ring on MPI point-to-point messages that
// adds the ranks' values in the canonical order of package comm, so float32
// sums are bit-identical to those of the in-process backend (comm/local)
// for the same inputs. Integer all-reduces
// under 64 KiB, whose sums do not depend on the order, use MPI_Iallreduce.
// All-gathers of 64 KiB or more use the same ring (Open MPI's non-blocking
// collectives are slow for large buffers), smaller ones MPI_Iallgatherv;
// broadcasts and barriers use MPI_Ibcast and MPI_Ibarrier.
//
// # Failures
//
// MPI cannot cancel a call that other ranks take part in. When a Wait ends
// because its context ended, or when a rank calls Abort (Run does so for an
// error or a panic), the rank logs a message naming itself and the cause and
// calls MPI_Abort, which ends every process of the job; mpirun exits non-zero.
// When a process dies (exits without MPI_Finalize, or is killed), mpirun
// terminates the others. No call therefore waits forever for a dead peer.
//
// A call whose context has already ended when it is made returns an error
// wrapping ctx.Err() without starting: the rank is then out of step with the
// others, so return the error and exit (Run aborts the job for you).
package mpi

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/debug"
	"sync"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
)

// Config tunes Open. Zero values select the defaults.
type Config struct {
	// Lib is the MPI library to load (default: $SPARSEGRAD_LIBMPI, then
	// libmpi.so.40, then libmpi.so).
	Lib string
	// SegmentBytes is the size of the ring's pipelined messages (default
	// 1 MiB).
	SegmentBytes int
	// Window is how many ring receives are posted ahead (default 4).
	Window int
	// CloseTimeout bounds how long Close waits for unfinished operations
	// (such as sends no rank receives) before aborting the job (default 60s).
	CloseTimeout time.Duration
}

// Defaults of Config.
const (
	DefaultSegmentBytes = 1 << 20
	DefaultWindow       = 4
	DefaultCloseTimeout = 60 * time.Second
)

// tagLimit is the largest tag every MPI implementation accepts (MPI_TAG_UB is
// at least 32767); the ring's internal tags stay below it. User tags may go up
// to the library's MPI_TAG_UB (2^31−1 for Open MPI's ob1).
const tagLimit = 32767

var (
	stateMu sync.Mutex
	state   int // 0: never opened, 1: open, 2: closed
)

// Comm is this process's communicator over MPI_COMM_WORLD. It implements
// comm.Communicator. A process has at most one: MPI can be initialized once.
type Comm struct {
	e        *engine
	cfg      Config
	version  string
	closeMu  sync.Mutex
	closed   bool
	closeErr error
}

var _ comm.Communicator = (*Comm)(nil)

// Open loads the MPI library and initializes MPI with the default Config.
func Open(ctx context.Context) (*Comm, error) { return OpenConfig(ctx, Config{}) }

// OpenConfig loads the MPI library and initializes MPI. It may be called once
// per process (MPI cannot be initialized twice). Close the Comm before the
// process exits: under mpirun, a process that ends without MPI_Finalize makes
// the whole job fail (Run closes it for you). If ctx ends before MPI_Init
// returns, OpenConfig returns an error wrapping ctx.Err() and the process
// should exit. Without a launcher (see Detect), Open MPI starts a singleton
// job of size 1.
func OpenConfig(ctx context.Context, cfg Config) (*Comm, error) {
	if cfg.SegmentBytes < 0 || cfg.Window < 0 || cfg.CloseTimeout < 0 {
		return nil, fmt.Errorf("mpi: negative Config value %+v; use 0 for the defaults", cfg)
	}
	if cfg.SegmentBytes == 0 {
		cfg.SegmentBytes = DefaultSegmentBytes
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.CloseTimeout == 0 {
		cfg.CloseTimeout = DefaultCloseTimeout
	}
	cfg.SegmentBytes = max(8, cfg.SegmentBytes/8*8)
	stateMu.Lock()
	defer stateMu.Unlock()
	switch state {
	case 1:
		return nil, fmt.Errorf("mpi: Open called while a Comm is open; MPI allows one per process, share it")
	case 2:
		return nil, fmt.Errorf("mpi: Open called after Close; MPI cannot be initialized twice in one process")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mpi: Open: %w", err)
	}
	l, err := loadLib(cfg.Lib)
	if err != nil {
		return nil, err
	}
	e := &engine{
		l: l, segBytes: cfg.SegmentBytes, window: cfg.Window,
		submit:  make(chan *task),
		abortCh: make(chan abortMsg),
		stopCh:  make(chan stopMsg),
		dead:    make(chan struct{}),
		yield:   oversubscribed(),
		pending: map[*task]struct{}{},
	}
	ready := make(chan error, 1)
	go e.loop(ready)
	select {
	case err := <-ready:
		if err != nil {
			state = 2
			return nil, err
		}
	case <-ctx.Done():
		state = 2
		return nil, fmt.Errorf("mpi: MPI_Init did not complete: %w", ctx.Err())
	}
	state = 1
	c := &Comm{e: e, cfg: cfg, version: e.version}
	slog.Debug("MPI initialized", "rank", e.rank, "size", e.size, "library", l.path, "version", c.version)
	return c, nil
}

// Rank is this process's rank in MPI_COMM_WORLD.
func (c *Comm) Rank() int { return c.e.rank }

// Size is the number of processes in MPI_COMM_WORLD.
func (c *Comm) Size() int { return c.e.size }

// TagUB is the largest tag Send and Recv accept (the library's MPI_TAG_UB).
func (c *Comm) TagUB() int { return c.e.tagUB }

// Version is the MPI library's version line.
func (c *Comm) Version() string { return c.version }

// Close waits for unfinished operations (at most Config.CloseTimeout, then
// the job is aborted), frees the communicators and calls MPI_Finalize, which
// waits for the other ranks. Later calls return an error; Close may be called
// more than once.
func (c *Comm) Close() error {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.closed {
		return c.closeErr
	}
	c.closed = true
	e := c.e
	e.mu.Lock()
	e.pending = nil // refuse new calls
	e.mu.Unlock()
	reply := make(chan error, 1)
	select {
	case e.stopCh <- stopMsg{deadline: time.Now().Add(c.cfg.CloseTimeout), reply: reply}:
		c.closeErr = <-reply
	case <-e.dead:
		c.closeErr = fmt.Errorf("mpi: Close: the progress goroutine has already ended")
	}
	stateMu.Lock()
	state = 2
	stateMu.Unlock()
	return c.closeErr
}

// Abort ends the whole job because this rank failed with err: it logs a
// message naming this rank and err and calls MPI_Abort, which terminates every
// process of the job (mpirun then exits non-zero). It does not return.
func (c *Comm) Abort(err error) {
	msg := fmt.Sprintf("mpi: rank %d of %d failed: %v; aborting the MPI job", c.e.rank, c.e.size, err)
	go func() {
		// MPI_Abort should end the process at once; never hang.
		time.Sleep(30 * time.Second)
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(1)
	}()
	c.e.requestAbort(msg, 1)
	select {}
}

// Run opens MPI, calls fn with the communicator, and closes it. If fn returns
// an error or panics, the job is aborted with a message naming this rank
// (Abort), so the other ranks end too instead of waiting for this one; Run
// then does not return. Errors of Open and Close are returned.
func Run(ctx context.Context, fn func(ctx context.Context, c comm.Communicator) error) error {
	c, err := Open(ctx)
	if err != nil {
		return err
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				c.Abort(fmt.Errorf("panic: %v\n%s", p, debug.Stack()))
			}
		}()
		if err := fn(ctx, c); err != nil {
			c.Abort(err)
		}
	}()
	return c.Close()
}
