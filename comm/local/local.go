// Package local owns the in-process communicator backend: N workers run as
// goroutines of one process and exchange data through shared memory, with the
// semantics and the canonical summation order documented in package comm. It
// is the default backend, so -workers N needs no setup.
//
// # Design
//
// Each collective call is a rendezvous. Ranks are matched by their per-rank
// call sequence number (every rank makes the same collective calls in the same
// order), publish their buffers in a shared slot, and then move the data
// themselves by reading their peers' buffers directly: there is no per-element
// channel traffic and no intermediate copy. An all-reduce of length L on n
// ranks is a reduce-scatter and an all-gather fused into one pass over shared
// memory: rank j sums chunk j (comm.ChunkBounds) of every rank's buffer in the
// canonical order j+1, …, n−1, 0, …, j, a cache-sized tile at a time, and
// stores each summed tile into chunk j of every rank's buffer. Only rank j
// touches chunk j of any buffer, so this is safe in place; a final barrier
// keeps every buffer in use until all ranks are done. In all, n·L elements are
// read and n·L written, the same as one copy of every buffer.
//
// Point-to-point messages are matched by (source, destination, tag) in issue
// order. Send and ISend copy the message into a mailbox (or straight into a
// receive that is already waiting) and return, so pairs of ranks exchanging
// with each other cannot deadlock. SendRecv, which posts its receive first,
// queues its send by reference while its receive is pending and copies it
// only if the destination has not taken it by the time the receive is done:
// in the usual pairwise exchange no intermediate copy is made.
//
// # Device buffers
//
// The collective calls take comm.Device buffers in device memory too
// (comm.DeviceMover): each rank records an event on its buffers' stream at
// the call's start and publishes it at the rendezvous with its buffers.
// Where every rank's buffers are memory of devices that reduce peers'
// memory and reach each other's (comm.PeerDevice: ranks sharing a GPU, or
// on GPUs with peer access), the call runs on the devices and the host
// waits for nothing: each rank's work goes on a stream of its own on its
// own device (after every rank's start event) — rank j adds chunk j of
// every rank's buffer in the canonical order with one kernel that stores
// the sum into every rank's buffer, and gathers and broadcasts are
// device-to-device copies — and the caller's stream then waits for every
// rank's work. The bits are the host's whatever the devices. Otherwise
// (devices that do not reach each other, more ranks than one kernel adds,
// host and device buffers mixed) each rank stages its device buffers through host
// memory (comm.StageBuffer: page-locked where the device has it), the host
// algorithm runs on the copies, and the results are copied back.
// The point-to-point calls take device buffers too: the receiver copies
// the message on a stream of its own after both calls' start events
// (device to device on one device or between devices that reach each
// other; through host memory between other devices, or between host and
// device memory), and each caller's stream waits for the copies of its
// buffers. The message of SendRecv and ISend is the sender's buffer itself
// — a device send waits on the host (in SendRecv, or ISend's Wait) for its
// receive to be posted, not for any copy; Send, which returns without
// waiting for the receive, copies the buffer on its stream into device
// memory the rank keeps for messages (grown to the sizes and the number
// of its messages in flight, freed when Run returns), so that the sender may write its buffer again at once.
//
// # Failures
//
// When a worker returns an error, panics (Run recovers it and reports the
// stack), calls World.Abort, or sees its context cancelled inside a call, the
// world is aborted: every pending and later call of every rank returns at once
// an error that wraps comm.ErrAborted and names the failing rank and its error.
// A rank whose worker function returns normally under Run makes no more calls:
// a peer waiting for it in a collective it never joined, or in a receive of a
// message it never sent, gets an error saying so instead of hanging. (Worlds
// built with New and driven by the caller rely on World.Abort and contexts.)
//
// # Network emulation
//
// With WithNetwork, every call additionally lasts as long as the α-β model of
// comm/netmodel says it would take on that network (the in-process time already
// spent is subtracted); non-blocking calls elapse their delay in the
// background, so overlap of communication with computation is real.
package local

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/device"
)

// Option configures a World.
type Option func(*config)

type config struct {
	net     *netmodel.Network
	timeout time.Duration
}

// WithTimeout makes a call that has waited d for its peers fail with an
// error saying so, and abort the world (a rank is stuck or skipped a call).
// Zero, the default, waits as long as the context allows.
func WithTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d }
}

// WithNetwork makes every call of the world last as long as it would on the
// modelled network net (see netmodel.Network.Cost): a collective ends its
// modelled time after the last rank joined it, or after the previous
// collective ended if that is later (collectives in flight at once take
// turns on the wire); a message arrives its modelled
// time after its send started, and Send, SendRecv and ISend's Wait return
// then too (the sender is busy while its bytes are on the wire). The
// in-process time already spent counts towards the modelled time.
// Non-blocking calls elapse their delay in the background. An invalid net
// (see netmodel.Network.Validate) makes Run fail and New panic.
func WithNetwork(net netmodel.Network) Option {
	return func(c *config) { n := net; c.net = &n }
}

// World is a set of n in-process ranks that communicate with each other.
type World struct {
	n   int
	cfg config

	abortOnce sync.Once
	aborted   chan struct{}
	abortErr  error

	mu    sync.Mutex
	slots map[uint64]*slot
	// linkFree is when the emulated network's last collective ends:
	// collectives in flight at once (non-blocking calls, such as the
	// buckets of dense overlapped with the backward pass) take turns on
	// the wire, as on one link, rather than each having all of its
	// bandwidth.
	linkFree time.Time
	boxes    map[mailKey]*mailbox

	bg    sync.WaitGroup // background goroutines of non-blocking calls
	comms []*rankComm

	// Ranks whose worker function returned under Run and whose non-blocking
	// calls have all finished: they will make no more calls. Guarded by mu,
	// except exited, which is read without it; exitCh is closed and replaced
	// whenever a rank exits.
	fnDone  []bool
	pending []int
	exited  []atomic.Bool
	exitCh  chan struct{}
}

// New creates a world of n ranks (n >= 1). Use Comm to get each rank's
// communicator; prefer Run, which also handles failures and panics. New
// panics if n < 1.
func New(n int, opts ...Option) *World {
	if n < 1 {
		panic(fmt.Sprintf("local.New: world size %d is invalid: need at least 1 rank", n))
	}
	w := &World{
		n:       n,
		aborted: make(chan struct{}),
		slots:   make(map[uint64]*slot),
		boxes:   make(map[mailKey]*mailbox),
		fnDone:  make([]bool, n),
		pending: make([]int, n),
		exited:  make([]atomic.Bool, n),
		exitCh:  make(chan struct{}),
	}
	for _, o := range opts {
		o(&w.cfg)
	}
	if err := w.cfg.validate(); err != nil {
		panic("local.New: " + err.Error())
	}
	w.comms = make([]*rankComm, n)
	for r := range w.comms {
		w.comms[r] = &rankComm{w: w, rank: r}
	}
	return w
}

// Size is the number of ranks of the world.
func (w *World) Size() int { return w.n }

// Comm returns rank's communicator. It panics if rank is not in [0, Size()).
func (w *World) Comm(rank int) comm.Communicator {
	if rank < 0 || rank >= w.n {
		panic(fmt.Sprintf("local.World.Comm: rank %d out of range [0, %d)", rank, w.n))
	}
	return w.comms[rank]
}

// Abort marks the world as failed because of rank's error err: every pending
// and later call of every rank returns an error that wraps comm.ErrAborted and
// err and names rank. Only the first Abort counts.
func (w *World) Abort(rank int, err error) {
	if err == nil {
		err = errors.New("aborted without an error")
	}
	w.abortOnce.Do(func() {
		w.abortErr = fmt.Errorf("%w: rank %d failed: %w", comm.ErrAborted, rank, err)
		close(w.aborted)
	})
}

// Err returns the error the world was aborted with, or nil.
func (w *World) Err() error {
	select {
	case <-w.aborted:
		return w.abortErr
	default:
		return nil
	}
}

// errClosed is the cause given when Run ends while non-blocking calls that
// were never waited for are still pending.
var errClosed = errors.New("local: world closed: Run returned while this call was pending")

// Run starts n workers, each calling fn with its own communicator, and waits
// for all of them. If a worker returns an error or panics, the world is
// aborted (every other worker's calls fail with comm.ErrAborted) and Run
// returns the first failure; errors that merely report the abort are not
// returned in its place. When Run returns, no goroutine of the world is left.
func Run(ctx context.Context, n int, fn func(ctx context.Context, c comm.Communicator) error, opts ...Option) error {
	if n < 1 {
		return fmt.Errorf("local.Run: world size %d is invalid: need at least 1 worker", n)
	}
	if fn == nil {
		return errors.New("local.Run: fn is nil")
	}
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("local.Run: %w", err)
	}
	w := New(n, opts...)
	errs := make([]error, n)
	var wg sync.WaitGroup
	var first atomic.Int64
	first.Store(-1)
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := runOne(ctx, w, r, fn)
			if err != nil {
				errs[r] = err
				if !errors.Is(err, comm.ErrAborted) {
					first.CompareAndSwap(-1, int64(r))
				}
				w.Abort(r, err)
			}
			w.finish(r)
		}()
	}
	wg.Wait()
	w.Abort(-1, errClosed) // releases pending non-blocking calls nobody waited for
	w.bg.Wait()
	w.closeStreams()
	var perrs []error
	for _, c := range w.comms {
		perrs = append(perrs, c.dpool.close())
	}
	perr := errors.Join(perrs...)
	if f := first.Load(); f >= 0 {
		return fmt.Errorf("rank %d: %w", f, errs[f])
	}
	for r, err := range errs {
		if err != nil {
			return fmt.Errorf("rank %d: %w", r, err)
		}
	}
	if perr != nil {
		return fmt.Errorf("local.Run: freeing the device memory of messages: %w", perr)
	}
	return nil
}

// finish records that rank r's worker function returned.
func (w *World) finish(r int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fnDone[r] = true
	w.maybeExitLocked(r)
}

func (w *World) maybeExitLocked(r int) {
	if w.fnDone[r] && w.pending[r] == 0 && !w.exited[r].Load() {
		w.exited[r].Store(true)
		close(w.exitCh)
		w.exitCh = make(chan struct{})
	}
}

func runOne(ctx context.Context, w *World, r int, fn func(context.Context, comm.Communicator) error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("worker panicked: %v\n%s", p, debug.Stack())
		}
	}()
	return fn(ctx, w.comms[r])
}

func (c *config) validate() error {
	if c.timeout < 0 {
		return fmt.Errorf("WithTimeout: %v is negative: use a positive duration, or 0 for no timeout", c.timeout)
	}
	if c.net != nil {
		if err := c.net.Validate(); err != nil {
			return fmt.Errorf("WithNetwork: %w", err)
		}
	}
	return nil
}

// rankComm is one rank's communicator.
type rankComm struct {
	w    *World
	rank int
	seq  uint64 // next collective sequence number; used by one goroutine at a time

	// pstreams are the rank's streams of device work, one per device
	// (device.go), used under pmu.
	pmu      sync.Mutex
	pstreams map[device.Device]device.Stream
	// dpool holds the messages the rank's Send sent from device memory
	// (the rank's own, so that what it allocates depends on its messages in
	// flight alone, not on how its peers' interleave with them).
	dpool devPool
}

// Abort aborts the world because of this rank's error err (see World.Abort).
// Workers started by Run reach it with a type assertion:
//
//	c.(interface{ Abort(error) }).Abort(err)
func (c *rankComm) Abort(err error) { c.w.Abort(c.rank, err) }

// Rank is this worker's rank.
func (c *rankComm) Rank() int { return c.rank }

// Size is the number of ranks of the world.
func (c *rankComm) Size() int { return c.w.n }

// wait blocks until ch is closed, the world is aborted, or ctx ends; a context
// that ends aborts the world, since the peers would otherwise wait forever.
func (c *rankComm) wait(ctx context.Context, ch <-chan struct{}, what what) error {
	return c.waitFor(ctx, ch, what, nil)
}

// waitFor is wait that also fails when missing reports a rank (>= 0) whose
// worker has returned and that therefore can never close ch.
func (c *rankComm) waitFor(ctx context.Context, ch <-chan struct{}, what what, missing func() int) error {
	// Peers usually arrive within microseconds: yielding a few times is much
	// cheaper than parking the goroutine and waking it up again.
	for range spinYields {
		select {
		case <-ch:
			return nil
		default:
		}
		runtime.Gosched()
	}
	w := c.w
	var timeout <-chan time.Time
	if w.cfg.timeout > 0 {
		t := time.NewTimer(w.cfg.timeout)
		defer t.Stop()
		timeout = t.C
	}
	for {
		w.mu.Lock()
		exitCh := w.exitCh
		w.mu.Unlock()
		if missing != nil {
			select {
			case <-w.aborted: // the abort, not its consequence, is the news
				return fmt.Errorf("local: rank %d %s: %w", c.rank, what(), w.abortErr)
			default:
			}
			if r := missing(); r >= 0 {
				select {
				case <-ch: // completed just before rank r exited
					return nil
				default:
				}
				return fmt.Errorf("local: rank %d %s: rank %d has returned from its worker function and will never make the matching call: every rank must make the same collective calls, and every receive needs a send", c.rank, what(), r)
			}
		}
		select {
		case <-ch:
			return nil
		case <-w.aborted:
			return fmt.Errorf("local: rank %d %s: %w", c.rank, what(), w.abortErr)
		case <-ctx.Done():
			err := fmt.Errorf("local: rank %d %s: %w", c.rank, what(), ctx.Err())
			w.Abort(c.rank, err)
			return err
		case <-exitCh:
		case <-timeout:
			err := fmt.Errorf("local: rank %d %s: no progress for %v (WithTimeout): a peer is stuck or skipped the matching call", c.rank, what(), w.cfg.timeout)
			w.Abort(c.rank, err)
			return err
		}
	}
}

// spinYields is how many times wait yields the processor before it blocks.
const spinYields = 64

// what describes a call for error messages; it is only evaluated on errors,
// so that the success path formats nothing.
type what func() string

// lit is a what of a fixed text.
func lit(s string) what { return func() string { return s } }

// check returns an error if the world is already aborted or ctx has ended.
func (c *rankComm) check(ctx context.Context, what what) error {
	select {
	case <-c.w.aborted:
		return fmt.Errorf("local: rank %d %s: %w", c.rank, what(), c.w.abortErr)
	default:
	}
	if err := ctx.Err(); err != nil {
		err = fmt.Errorf("local: rank %d %s: %w", c.rank, what(), err)
		c.w.Abort(c.rank, err)
		return err
	}
	return nil
}

// request is a non-blocking call in flight.
type request struct {
	c    *rankComm
	done chan struct{}
	n    int
	err  error
	what string
}

// Wait blocks until the call completed and returns its result.
func (r *request) Wait(ctx context.Context) (int, error) {
	if err := r.c.wait(ctx, r.done, func() string { return "waiting for " + r.what }); err != nil {
		// The call itself may have finished with a more precise error.
		select {
		case <-r.done:
			return r.n, r.err
		default:
		}
		return 0, err
	}
	return r.n, r.err
}

// async runs f in the background and returns its request.
func (c *rankComm) async(what string, f func() (int, error)) *request {
	r := &request{c: c, done: make(chan struct{}), what: what}
	w := c.w
	w.bg.Add(1)
	w.mu.Lock()
	w.pending[c.rank]++
	w.mu.Unlock()
	go func() {
		defer w.bg.Done()
		defer func() {
			w.mu.Lock()
			w.pending[c.rank]--
			w.maybeExitLocked(c.rank)
			w.mu.Unlock()
		}()
		r.n, r.err = f()
		if r.err != nil {
			r.n = 0
		}
		close(r.done)
	}()
	return r
}
