package cuda

import (
	"errors"
	"fmt"
	"os"

	"github.com/sparsegrad/sparsegrad/engine"
)

// EnvGraphs names the environment variable that turns CUDA graphs off
// (SPARSEGRAD_CUDA_GRAPHS=0): the engine then launches every kernel of
// every run itself.
const EnvGraphs = "SPARSEGRAD_CUDA_GRAPHS"

// graph is a captured and instantiated CUDA graph.
type graph struct {
	s          *Stream
	g, exec    uintptr
	launchable bool
}

var _ engine.Replay = (*graph)(nil)

// Capture implements engine.Capturer: the work f issues on the stream is
// recorded into a CUDA graph instead of run (kernel launches, copies,
// memsets, cuBLAS and cuDNN calls, and event records as graph nodes), and
// the graph is instantiated; Launch replays it with one call, which is
// how a step of thousands of small kernels (the LSTM's) stops paying a
// launch's host cost per kernel.
func (s *Stream) Capture(f func() error) (engine.Replay, error) {
	if os.Getenv(EnvGraphs) == "0" {
		return nil, engine.ErrNoCapture
	}
	// The capture's work is issued from one locked thread (Hold).
	defer s.Hold()()
	if err := check("cuStreamBeginCapture", drv.cuStreamBeginCapture(s.h, captureRelaxed)); err != nil {
		return nil, err
	}
	s.capturing = true
	ferr := f()
	s.capturing = false
	g := &graph{s: s}
	if err := check("cuStreamEndCapture", drv.cuStreamEndCapture(s.h, &g.g)); err != nil {
		return nil, err
	}
	if ferr != nil {
		return nil, errors.Join(fmt.Errorf("cuda: capturing a graph: %w", ferr), check("cuGraphDestroy", drv.cuGraphDestroy(g.g)))
	}
	if err := check("cuGraphInstantiateWithFlags", drv.cuGraphInstantiate(&g.exec, g.g, 0)); err != nil {
		return nil, errors.Join(err, check("cuGraphDestroy", drv.cuGraphDestroy(g.g)))
	}
	g.launchable = true
	return g, nil
}

// Launch implements engine.Replay.
func (g *graph) Launch() error {
	unlock, err := g.s.enter()
	if err != nil {
		return err
	}
	defer unlock()
	counts.launches.Add(1)
	counts.graphs.Add(1)
	if err := check("cuGraphLaunch", drv.cuGraphLaunch(g.exec, g.s.h)); err != nil {
		return err
	}
	return g.s.checkLaunch("the replayed graph (SPARSEGRAD_CUDA_GRAPHS=0 runs its kernels one by one, each named)")
}

// Close implements engine.Replay.
func (g *graph) Close() error {
	if !g.launchable {
		return nil
	}
	g.launchable = false
	unlock, err := g.s.d.enter()
	if err != nil {
		return err
	}
	defer unlock()
	return errors.Join(check("cuGraphExecDestroy", drv.cuGraphExecDestroy(g.exec)), check("cuGraphDestroy", drv.cuGraphDestroy(g.g)))
}
