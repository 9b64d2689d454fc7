package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
)

// TestMPIEmulatedNetwork: under a real mpirun -np 2 and 3, -net-latency and
// -net-bandwidth delay the processes' calls as the α-β model says (the
// gradient's all-reduce of a known size takes at least its modelled time
// each step) and change no bit of the training.
func TestMPIEmulatedNetwork(t *testing.T) {
	mpirun := testenv.MPIRun(t)
	d := testenv.SharedData(t, "ml-100k/u.data")
	const steps = 4
	// 1 ms and 0.1 Gbit/s: NCF's 431 kB gradient takes 35–50 ms.
	net := netmodel.Network{Latency: time.Millisecond, Bandwidth: 0.1e9 / 8}
	for _, np := range []int{2, 3} {
		t.Run(fmt.Sprintf("np=%d", np), func(t *testing.T) {
			run := func(name string, extra ...string) string {
				out := filepath.Join(t.TempDir(), name)
				args := []string{"--oversubscribe", "--allow-run-as-root", "-np", strconv.Itoa(np), os.Args[0],
					"-model", "ncf", "-dataset", "ml-100k", "-data-dir", d, "-steps", strconv.Itoa(steps), "-sparsifier", "dense",
					"-overlap", "off", "-bucket-mb", "0", "-quiet", "-max-eval-batches", "1", "-seed", "7", "-blas-threads", "1", "-out", out}
				cmd := testenv.Command(t, 3*time.Minute, mpirun, append(args, extra...)...)
				cmd.Env = append(os.Environ(), mainEnv+"=1")
				b, err := cmd.CombinedOutput()
				if testenv.PastLimit(cmd) {
					t.Fatalf("mpirun did not finish in time:\n%s", b)
				}
				if err != nil {
					t.Fatalf("mpirun %v: %v\n%s", extra, err, b)
				}
				return out
			}
			plain := run("plain")
			slow := run("slow", "-net-latency", net.Latency.String(), "-net-bandwidth", "0.1")
			want, got := losses(t, plain), losses(t, slow)
			if len(got) != steps || len(want) != steps {
				t.Fatalf("%d and %d losses, want %d", len(want), len(got), steps)
			}
			for s := range got {
				if math.Float64bits(got[s]) != math.Float64bits(want[s]) {
					t.Fatalf("step %d: loss %v with the emulated network, %v without", s+1, got[s], want[s])
				}
			}
			for _, st := range rundirtest.OpSteps(t, slow, "allreduce") {
				model := net.Cost(comm.OpAllReduce, np, st.Elements, 4, nil)
				if st.Calls != 1 || st.Time < model.Seconds()-1e-3 {
					t.Errorf("step %d: %d all-reduces of %d elements took %.1f ms, the model says %v for one", st.Step, st.Calls, st.Elements, st.Time*1e3, model)
				}
			}
		})
	}
}
