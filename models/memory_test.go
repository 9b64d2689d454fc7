package models

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// Peak resident memory of one worker's training loop (model, gradient,
// optimizer state; 5 steps on random data) and its median step time after
// the first step, each model in its own process.
// Measurement only: run with
//
//	SPARSEGRAD_RUN=memory SPARSEGRAD_TEST_BLAS=openblas go test -run TestPeakMemory -v ./models
//
// and compare with scripts/memory-torch.py (same models, batches and
// threads in PyTorch); docs/bench/memory.md records both.

type memoryCase struct {
	name  string
	build func() (Model, error)
	batch func(r *rand.Rand, m *host) Batch
	adam  bool
}

const wikitext2Vocab = 33278

func memoryCases() []memoryCase {
	return []memoryCase{
		{"resnet18-b32", func() (Model, error) { return NewResNet(DefaultResNet18(10, 32)) }, resnetBatch(32), false},
		{"lstm-default-b32", func() (Model, error) { return NewLSTM(DefaultLSTM(wikitext2Vocab, 32)) }, lstmBatch(30, 32), false},
		{"lstm-small-b32", func() (Model, error) { return NewLSTM(SmallLSTM(wikitext2Vocab, 32)) }, lstmBatch(20, 32), false},
		{"ncf-default-ml20m-b256", func() (Model, error) { return NewNCF(DefaultNCF(138493, 26744, 256)) }, ncfBatch(256), true},
		{"ncf-paper-ml1m-b256", func() (Model, error) { return NewNCF(PaperNCF(6040, 3706, 256)) }, ncfBatch(256), true},
	}
}

type memoryResult struct {
	Model     string  `json:"model"`
	PeakRSSMB float64 `json:"peak_rss_mb"`
	StepSec   float64 `json:"step_s"`
}

func TestPeakMemory(t *testing.T) {
	testenv.OptIn(t, "memory", "the peak-memory measurement")
	for _, c := range memoryCases() {
		cmd := testenv.Command(t, 30*time.Minute, os.Args[0], "-test.run=^TestPeakMemoryChild$", "-test.v")
		cmd.Env = append(os.Environ(), "SPARSEGRAD_MEMORY_CHILD="+c.name)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", c.name, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "MEMORY ") {
				fmt.Println(strings.TrimPrefix(l, "MEMORY "))
			}
		}
	}
}

func TestPeakMemoryChild(t *testing.T) {
	name := os.Getenv("SPARSEGRAD_MEMORY_CHILD")
	if name == "" {
		t.Skip("run by TestPeakMemory")
	}
	for _, c := range memoryCases() {
		if c.name != name {
			continue
		}
		m, err := hostOf(c.build())
		if err != nil {
			t.Fatal(err)
		}
		n := m.NumParams()
		grad := make([]float32, n)
		s1 := make([]float32, n) // momentum, or Adam's first moment
		var s2 []float32
		if c.adam {
			s2 = make([]float32, n)
		}
		r := rand.New(rand.NewPCG(1, 2))
		var times []time.Duration
		for i := 0; i < 5; i++ {
			b := c.batch(r, m)
			t0 := time.Now()
			if _, err := m.TrainStep(context.Background(), b, grad); err != nil {
				t.Fatal(err)
			}
			p := m.Params()
			for j := range p {
				s1[j] = 0.9*s1[j] + grad[j]
				if s2 != nil {
					s2[j] = 0.999*s2[j] + 0.001*grad[j]*grad[j]
				}
				p[j] -= 1e-3 * s1[j]
			}
			times = append(times, time.Since(t0))
		}
		// The median of the steps after the first (warm-up).
		times = times[1:]
		slices.Sort(times)
		b, _ := json.Marshal(memoryResult{Model: name, PeakRSSMB: peakRSSMB(t), StepSec: times[len(times)/2].Seconds()})
		fmt.Printf("MEMORY %s\n", b)
		return
	}
	t.Fatalf("unknown case %s", name)
}

// peakRSSMB reads the process's peak resident set (VmHWM) in MiB.
func peakRSSMB(t *testing.T) float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if f := strings.Fields(s.Text()); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb / 1024
		}
	}
	t.Fatal("no VmHWM in /proc/self/status")
	return 0
}
