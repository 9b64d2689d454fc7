package mpi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
)

// engine is the progress goroutine: one goroutine, locked to its OS thread,
// makes every MPI call of the process (MPI_THREAD_FUNNELED). It starts queued
// operations in submission order with MPI's non-blocking primitives, so that
// collectives are posted in the same order on every rank, and drives all
// active operations together by testing their MPI requests.
type engine struct {
	l                *lib
	world, coll, p2p uintptr // communicators: world, a dup for collectives, a dup for user point-to-point
	rank, size       int
	segBytes, window int

	submit  chan *task
	abortCh chan abortMsg
	stopCh  chan stopMsg
	dead    chan struct{} // closed when the goroutine has ended
	collSeq uint32        // collective sequence number (engine goroutine only)
	version string        // MPI_Get_library_version, set by init
	tagUB   int           // largest tag (MPI_TAG_UB), set by init
	yield   bool          // give the core away when idle (oversubscribed node)
	tmpFree [][]byte      // reusable ring receive buffers (engine goroutine only)

	// pending counts operations submitted but not finished (read by Close's
	// error message).
	mu      sync.Mutex
	pending map[*task]struct{}
}

// op is one communicator operation driven by the engine goroutine.
type op interface {
	// start posts the operation's first MPI calls.
	start(e *engine) error
	// progress tests and advances the operation. moved reports that
	// something completed or was posted; done that the operation has
	// finished, with n elements received.
	progress(e *engine) (done, moved bool, n int, err error)
	// describe names the operation in messages.
	describe() string
}

// task is an op and the request its caller waits on.
type task struct {
	op  op
	req *request
	// early completes req as soon as the op has started (buffered sends);
	// the engine still drives the op to its end.
	early bool
}

type abortMsg struct {
	msg  string
	code int
}

type stopMsg struct {
	deadline time.Time
	reply    chan error
}

// request is a call in flight; it implements comm.Request.
type request struct {
	e    *engine
	what string
	done chan struct{}
	once sync.Once
	n    int
	err  error
}

func (r *request) complete(n int, err error) {
	r.once.Do(func() {
		r.n, r.err = n, err
		close(r.done)
	})
}

// Wait blocks until the call completes. If ctx ends first, the job is
// aborted: MPI cannot cancel a call that other ranks take part in, so the
// only state that is not broken is a terminated job (MPI_Abort). Wait then
// returns an error wrapping ctx.Err() while the abort takes effect.
func (r *request) Wait(ctx context.Context) (int, error) {
	select {
	case <-r.done:
		return r.n, r.err
	default:
	}
	select {
	case <-r.done:
		return r.n, r.err
	case <-ctx.Done():
		err := fmt.Errorf("mpi: rank %d of %d: %s did not complete: %w; MPI cannot cancel a call in progress, so the job is being aborted",
			r.e.rank, r.e.size, r.what, ctx.Err())
		r.e.requestAbort(err.Error(), 1)
		return 0, err
	}
}

// doneRequest is a request that completed when it was made.
func (e *engine) doneRequest(what string, n int, err error) *request {
	r := &request{e: e, what: what, done: make(chan struct{})}
	r.complete(n, err)
	return r
}

// run submits o and returns its request.
func (e *engine) run(ctx context.Context, o op, early bool) (*request, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("mpi: %s not started: %w", o.describe(), err)
	}
	t := &task{op: o, req: &request{e: e, what: o.describe(), done: make(chan struct{})}, early: early}
	e.mu.Lock()
	if e.pending == nil {
		e.mu.Unlock()
		return nil, fmt.Errorf("mpi: %s: the communicator is closed", o.describe())
	}
	e.pending[t] = struct{}{}
	e.mu.Unlock()
	select {
	case e.submit <- t:
		return t.req, nil
	case <-e.dead:
		e.forget(t)
		return nil, fmt.Errorf("mpi: %s: the communicator is closed", o.describe())
	}
}

func (e *engine) forget(t *task) {
	e.mu.Lock()
	delete(e.pending, t)
	e.mu.Unlock()
}

// requestAbort asks the engine goroutine to call MPI_Abort; if it has ended,
// the process exits.
func (e *engine) requestAbort(msg string, code int) {
	select {
	case e.abortCh <- abortMsg{msg, code}:
	case <-e.dead:
		fmt.Fprintln(os.Stderr, msg)
		os.Exit(code)
	}
}

// loop is the engine goroutine. It initializes MPI, reports the result
// on ready (nil: initialized), and serves tasks until stopped.
func (e *engine) loop(ready chan<- error) {
	runtime.LockOSThread() // every MPI call comes from this thread
	defer close(e.dead)
	err := e.init()
	ready <- err
	if err != nil {
		return
	}

	var active []*task
	var stop *stopMsg
	var stopTimer <-chan time.Time
	idle := 0
	sleep := time.Duration(0)
	var idleSince time.Time
	startTask := func(t *task) {
		if err := t.op.start(e); err != nil {
			t.req.complete(0, err)
			e.forget(t)
			return
		}
		if t.early {
			t.req.complete(0, nil)
		}
		active = append(active, t)
	}
	for {
		if len(active) == 0 && stop != nil {
			stop.reply <- e.finish()
			return
		}
		if len(active) == 0 {
			select {
			case t := <-e.submit:
				startTask(t)
			case a := <-e.abortCh:
				e.abort(a)
			case s := <-e.stopCh:
				stop = &s
				stopTimer = time.After(time.Until(s.deadline))
			}
			idle, sleep = 0, 0
			continue
		}
	drain:
		for {
			select {
			case t := <-e.submit:
				startTask(t)
			case a := <-e.abortCh:
				e.abort(a)
			case s := <-e.stopCh:
				stop = &s
				stopTimer = time.After(time.Until(s.deadline))
			case <-stopTimer:
				var names []string
				for _, t := range active {
					names = append(names, t.op.describe())
				}
				e.abort(abortMsg{fmt.Sprintf("mpi: rank %d of %d: Close timed out waiting for %d unfinished operations (%s); aborting the job",
					e.rank, e.size, len(active), strings.Join(names, ", ")), 1})
			default:
				break drain
			}
		}
		moved := false
		for i := 0; i < len(active); {
			t := active[i]
			done, m, n, err := t.op.progress(e)
			moved = moved || m
			if !done && err == nil {
				i++
				continue
			}
			if t.early && err != nil {
				// Nobody waits for a buffered send any more: an error
				// here leaves the job inconsistent.
				e.abort(abortMsg{fmt.Sprintf("mpi: rank %d of %d: %s failed after it was buffered: %v", e.rank, e.size, t.op.describe(), err), 1})
			}
			t.req.complete(n, err)
			e.forget(t)
			active[i] = active[len(active)-1]
			active = active[:len(active)-1]
			moved = true
		}
		// Operations are only tested, never waited on, so that many can
		// progress together. MPI moves data only inside its calls, so the
		// engine polls; when nothing has completed for a while it yields,
		// and sleeps (so that a rank waiting for a slow peer does not burn
		// its core) unless an operation whose progress is invisible until
		// it completes (a library collective, a large message) is active.
		if moved {
			idle, sleep = 0, 0
			continue
		}
		if idle == 0 {
			idleSince = time.Now()
		}
		idle++
		if idle < 64 {
			continue
		}
		if idle%64 == 0 && time.Since(idleSince) > 5*time.Millisecond && !anyBusy(active) {
			sleep = min(max(2*sleep, 20*time.Microsecond), 200*time.Microsecond)
			time.Sleep(sleep)
			continue
		}
		// With more ranks than cores, yield the core, not just the
		// goroutine: the peer this rank waits for needs it.
		runtime.Gosched()
		if e.yield {
			osYield()
		}
	}
}

// busyOp is implemented by ops that must be polled without pause.
type busyOp interface{ busy() bool }

func anyBusy(active []*task) bool {
	for _, t := range active {
		if b, ok := t.op.(busyOp); ok && b.busy() {
			return true
		}
	}
	return false
}

func (e *engine) init() error {
	l := e.l
	sc := l.sc
	if rc := call(l.initThread, 0, 0, mpiThreadFunneled, ptr(&sc.provided)); rc != mpiSuccess {
		return fmt.Errorf("mpi: MPI_Init_thread failed: %s", l.errString(rc))
	}
	if sc.provided < mpiThreadFunneled {
		return fmt.Errorf("mpi: the MPI library provides thread level %d, below MPI_THREAD_FUNNELED; use an Open MPI built with thread support", sc.provided)
	}
	e.world = l.commWorld
	if rc := call(l.commRank, e.world, ptr(&sc.rank)); rc != mpiSuccess {
		return fmt.Errorf("mpi: MPI_Comm_rank: %s", l.errString(rc))
	}
	if rc := call(l.commSize, e.world, ptr(&sc.size)); rc != mpiSuccess {
		return fmt.Errorf("mpi: MPI_Comm_size: %s", l.errString(rc))
	}
	e.rank, e.size = int(sc.rank), int(sc.size)
	// MPI_TAG_UB: the attribute value is a pointer to the library's int.
	e.tagUB = tagLimit
	if rc := call(l.commGetAttr, e.world, mpiTagUBKey, ptr(&sc.attr), ptr(&sc.flag)); rc == mpiSuccess && sc.flag != 0 && sc.attr != 0 {
		call(l.memcpy, ptr(&sc.tagUB), sc.attr, 4)
		e.tagUB = max(tagLimit, int(sc.tagUB))
	}
	e.version = l.version()
	for _, dst := range []*uintptr{&e.coll, &e.p2p} {
		if rc := call(l.commDup, e.world, ptr(dst)); rc != mpiSuccess {
			return fmt.Errorf("mpi: MPI_Comm_dup: %s", l.errString(rc))
		}
		if rc := call(l.commSetErrhandler, *dst, l.errorsReturn); rc != mpiSuccess {
			return fmt.Errorf("mpi: MPI_Comm_set_errhandler: %s", l.errString(rc))
		}
	}
	return nil
}

// finish frees the communicators and finalizes MPI.
func (e *engine) finish() error {
	var errs []error
	for _, c := range []*uintptr{&e.coll, &e.p2p} {
		if rc := call(e.l.commFree, ptr(c)); rc != mpiSuccess {
			errs = append(errs, fmt.Errorf("mpi: MPI_Comm_free: %s", e.l.errString(rc)))
		}
	}
	if rc := call(e.l.finalize); rc != mpiSuccess {
		errs = append(errs, fmt.Errorf("mpi: MPI_Finalize: %s", e.l.errString(rc)))
	}
	return errors.Join(errs...)
}

// abort logs msg and terminates the whole job with MPI_Abort.
func (e *engine) abort(a abortMsg) {
	slog.Error("aborting the MPI job", "rank", e.rank, "size", e.size, "reason", a.msg)
	fmt.Fprintf(os.Stderr, "%s\n", a.msg)
	call(e.l.abort, e.world, uintptr(a.code))
	// MPI_Abort does not return; if it does, make sure the job still ends.
	os.Exit(a.code)
}

// getTmp returns a scratch buffer of n bytes, reusing a free one if possible.
func (e *engine) getTmp(n int) []byte {
	for i, b := range e.tmpFree {
		if cap(b) >= n {
			e.tmpFree[i] = e.tmpFree[len(e.tmpFree)-1]
			e.tmpFree = e.tmpFree[:len(e.tmpFree)-1]
			return b[:n]
		}
	}
	return make([]byte, n)
}

// putTmp returns a buffer of getTmp; a few are kept for the next ring.
func (e *engine) putTmp(b []byte) {
	if len(e.tmpFree) < 4*e.window {
		e.tmpFree = append(e.tmpFree, b)
	}
}

// oversubscribed reports whether this node runs more ranks than it has cores,
// as mpirun tells its processes (or as the user asks with Open MPI's
// mpi_yield_when_idle).
func oversubscribed() bool {
	return os.Getenv("OMPI_MCA_mpi_oversubscribe") == "1" || os.Getenv("OMPI_MCA_mpi_yield_when_idle") == "1"
}
