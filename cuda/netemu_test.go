package cuda_test

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/rundir/rundirtest"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

// TestTrainOverNCCLEmulatedNetwork: -net-latency and -net-bandwidth apply
// over NCCL (-comm nccl, a GPU per worker, as TestTrainOverNCCL runs):
// NCF's dense all-reduce of the whole gradient (-overlap off, one bucket)
// takes at least its modelled time every step at 1 ms and 0.01 Gbit/s, far
// more than without the emulated network, with every loss bit as without
// it. gTop-k's point-to-point messages (over NCCL too) give the same losses
// with and without it.
func TestTrainOverNCCLEmulatedNetwork(t *testing.T) {
	gpu(t)
	dir := ml100k(t)
	twoGPUsWithNCCL(t)
	const steps = 3
	net := netmodel.Network{Latency: time.Millisecond, Bandwidth: 0.01e9 / 8} // ~0.35 s an all-reduce: far above the emulator's own time even on a loaded machine
	run := func(sp string, emulate bool) ([]float64, []rundirtest.OpStep) {
		out := t.TempDir()
		c := train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: dir, Workers: train.Set(2), Steps: steps, Sparsifier: sp, Density: train.Set(0.05),
			Device: "cuda", Comm: "nccl", Pipeline: "off", Out: out, Clip: train.Set(0.0), Quiet: true, BLAS: "gonum", MaxEvalBatches: 1}
		if sp == "dense" {
			c.MethodOptions = sparsify.Values{"bucket_mb": 0.0}
		}
		if emulate {
			c.NetLatency, c.NetBandwidth = net.Latency, net.Bandwidth
		}
		var losses []float64
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		if err := train.Run(ctx, c, train.Options{LossSink: func(_ int, l float64) { losses = append(losses, l) }}); err != nil {
			t.Fatalf("%s, emulated network %v: %v", sp, emulate, err)
		}
		raw, err := os.ReadFile(filepath.Join(out, "run.json"))
		if err != nil {
			t.Fatal(err)
		}
		var info train.RunInfo
		if err := json.Unmarshal(raw, &info); err != nil {
			t.Fatal(err)
		}
		if info.Comm != "nccl" {
			t.Fatalf("%s: run.json comm %q, want nccl", sp, info.Comm)
		}
		if len(losses) != steps {
			t.Fatalf("%s: %d losses, want %d", sp, len(losses), steps)
		}
		return losses, rundirtest.OpSteps(t, out, "allreduce")
	}
	for _, sp := range []string{"dense", "gtopk"} {
		want, plain := run(sp, false)
		got, slow := run(sp, true)
		for s := range got {
			if math.Float64bits(got[s]) != math.Float64bits(want[s]) {
				t.Fatalf("%s step %d: loss %v with the emulated network, %v without", sp, s+1, got[s], want[s])
			}
		}
		if sp != "dense" {
			continue
		}
		for i, st := range slow {
			model := net.Cost(comm.OpAllReduce, 2, st.Elements, 4, nil)
			if st.Calls != 1 || st.Time < model.Seconds()-1e-3 {
				t.Errorf("step %d: %d all-reduces of %d elements took %.1f ms with the emulated network, the model says %v for one", st.Step, st.Calls, st.Elements, st.Time*1e3, model)
			}
			if p := plain[i].Time; p >= model.Seconds()/2 {
				t.Errorf("step %d: the all-reduce took %.1f ms without the emulated network, against the model's %v: the test cannot tell them apart", st.Step, p*1e3, model)
			}
			t.Logf("step %d: the all-reduce of %d elements over NCCL took %.1f ms emulated (model %v), %.1f ms without", st.Step, st.Elements, st.Time*1e3, model, plain[i].Time*1e3)
		}
	}
}
