package cuda

import (
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
	unlock := s.d.enter()
	if err := check("cuStreamBeginCapture", drv.cuStreamBeginCapture(s.h, captureRelaxed)); err != nil {
		unlock()
		return nil, err
	}
	s.capturing = true
	unlock()
	ferr := f()
	defer s.d.enter()()
	s.capturing = false
	g := &graph{s: s}
	if err := check("cuStreamEndCapture", drv.cuStreamEndCapture(s.h, &g.g)); err != nil {
		return nil, err
	}
	if ferr != nil {
		drv.cuGraphDestroy(g.g)
		return nil, fmt.Errorf("cuda: capturing a graph: %w", ferr)
	}
	if err := check("cuGraphInstantiateWithFlags", drv.cuGraphInstantiate(&g.exec, g.g, 0)); err != nil {
		drv.cuGraphDestroy(g.g)
		return nil, err
	}
	g.launchable = true
	return g, nil
}

// Launch implements engine.Replay.
func (g *graph) Launch() error {
	defer g.s.d.enter()()
	counts.launches.Add(1)
	counts.graphs.Add(1)
	return check("cuGraphLaunch", drv.cuGraphLaunch(g.exec, g.s.h))
}

// Close implements engine.Replay.
func (g *graph) Close() error {
	if !g.launchable {
		return nil
	}
	g.launchable = false
	defer g.s.d.enter()()
	drv.cuGraphExecDestroy(g.exec)
	return check("cuGraphDestroy", drv.cuGraphDestroy(g.g))
}
