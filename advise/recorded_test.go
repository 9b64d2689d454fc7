package advise

import (
	"bytes"
	"context"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/layout"
	"github.com/sparsegrad/sparsegrad/recorded"
)

func TestKindOf(t *testing.T) {
	for _, c := range []struct {
		model string
		names []string
		want  Kind
	}{
		{"resnet18", nil, CNN},
		{"ncf", nil, Recommender},
		{"lstm", nil, RNN},
		{"tinylm", []string{"emb.weight", "enc.layers.0.self_attn.in_proj_weight", "enc.layers.0.linear1.weight", "head.weight"}, Transformer},
		{"bert", []string{"embeddings.word_embeddings.weight", "encoder.layer.0.attention.self.query.weight"}, Transformer},
		{"ResNet", []string{"conv1.weight", "bn1.weight", "layer1.0.conv1.weight", "fc.weight"}, CNN},
		{"RNNModel", []string{"encoder.weight", "rnn.weight_ih_l0", "rnn.weight_hh_l0", "decoder.weight"}, RNN},
		{"NeuMF", []string{"mf_user_embed.weight", "mlp.0.weight"}, Recommender},
		{"Net", []string{"fc1.weight", "fc2.weight"}, MLP},
		{"odd", []string{"w", "b"}, OtherKind},
	} {
		if got := KindOf(c.model, c.names); got != c.want {
			t.Errorf("KindOf(%s, %v) = %s, want %s", c.model, c.names, got, c.want)
		}
	}
}

// TestEveryMethodHasKnowledge: what the advisor knows of the methods'
// accuracy is what their registry entries declare (sparsify's
// TestEveryMethodAdvises checks that every method declares some: one the
// advisor knows nothing about would be flagged everywhere without a word
// of why).
func TestEveryMethodHasKnowledge(t *testing.T) {
	for _, m := range []string{"randomk", "threshold"} {
		for _, k := range Kinds {
			if ShownFor(m, k, 0) {
				t.Errorf("%s counted as shown for %s", m, k)
			}
		}
	}
	if !ShownFor("deft", Recommender, 0.001) || ShownFor("micro", Transformer, 0) || ShownFor("cltk", OtherKind, 0) {
		t.Error("ShownFor disagrees with the knowledge table")
	}
}

// TestWriteTableFlagsUnshown: a method whose convergence is not shown for
// the model's kind is not ranked however fast it is; the verdict is about
// the ranked methods, and the table says why the faster one is left out.
func TestWriteTableFlagsUnshown(t *testing.T) {
	h := synthHost()
	h.Kind = Transformer
	ranked := []Prediction{
		{Method: "randomk", Density: 0.01, ActualDensity: 0.01, Iter: 0.05, Speedup: 2.4},
		{Method: "micro", Density: 0.01, ActualDensity: 0.01, Iter: 0.06, Speedup: 2},
		{Method: "cltk", Density: 0.01, ActualDensity: 0.01, Iter: 0.08, Speedup: 1.5},
		{Method: "dense", Density: 0.01, ActualDensity: 1, Iter: 0.12, Speedup: 1},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, h, Setting{Workers: 16, Density: 0.01}, ranked, nil); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(out, "\n")
	rankOf := func(m string) string {
		for _, l := range lines {
			f := strings.Fields(l)
			if len(f) > 1 && f[1] == m {
				return f[0]
			}
		}
		return ""
	}
	if rankOf("cltk") != "1" || rankOf("dense") != "2" || rankOf("randomk") != "!" || rankOf("micro") != "!" {
		t.Errorf("ranks: cltk %q dense %q randomk %q micro %q; want 1, 2, !, !\n%s", rankOf("cltk"), rankOf("dense"), rankOf("randomk"), rankOf("micro"), out)
	}
	for _, want := range []string{"cltk is predicted fastest", "randomk would be faster", "15.1× the iterations", "not shown for transformer", "kind of model: transformer"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table lacks %q:\n%s", want, out)
		}
	}
	// For a recommender MiCRO is shown on NCF by this project at ρ = 0.1
	// only: ranked there, flagged at ρ = 0.01 with the density it was
	// shown at.
	h.Kind = Recommender
	b.Reset()
	at := func(d float64) []Prediction {
		out := slices.Clone(ranked)
		for i := range out {
			out[i].Density = d
		}
		return out
	}
	WriteTable(&b, h, Setting{Workers: 16, Density: 0.1}, at(0.1), nil)
	if !strings.Contains(b.String(), "micro is predicted fastest") || !strings.Contains(b.String(), "shown for recommender at ρ = 0.1, 4 workers") {
		t.Errorf("for a recommender at ρ = 0.1 micro should rank first:\n%s", b.String())
	}
	b.Reset()
	WriteTable(&b, h, Setting{Workers: 16, Density: 0.01}, ranked, nil)
	if s := b.String(); strings.Contains(s, "micro is predicted fastest") || !strings.Contains(s, "shown for recommender only at ρ ≥ 0.1") || !strings.Contains(s, "not at ρ = 0.01") {
		t.Errorf("for a recommender at ρ = 0.01 micro should be flagged with the density it was shown at:\n%s", s)
	}
	// A model of unknown kind ranks nothing but dense, and says so.
	h.Kind = OtherKind
	b.Reset()
	WriteTable(&b, h, Setting{Workers: 16, Density: 0.01}, ranked, nil)
	if s := b.String(); !strings.Contains(s, "nothing is ranked") || !strings.Contains(s, "-kind") || rankOfIn(s, "cltk") != "!" || rankOfIn(s, "micro") != "!" {
		t.Errorf("a model of unknown kind:\n%s", s)
	}
}

// rankOfIn is the rank column of method's row in a table.
func rankOfIn(table, method string) string {
	for _, l := range strings.Split(table, "\n") {
		if f := strings.Fields(l); len(f) > 1 && f[1] == method {
			return f[0]
		}
	}
	return ""
}

// writeRecording writes a recording of p workers × s steps of random
// gradients over a small layout; stepTime 0 leaves it unmeasured.
func writeRecording(t *testing.T, p, s int, stepTime float64) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "rec")
	params := []recorded.Param{{Tensor: layout.Tensor{Name: "enc.self_attn.in_proj_weight", Shape: []int{96, 32}, Size: 3072}}, {Tensor: layout.Tensor{Name: "b", Shape: []int{7}, Size: 7}}, {Tensor: layout.Tensor{Name: "head.weight", Shape: []int{50, 32}, Size: 1600}}}
	w, err := recorded.Create(dir, recorded.Manifest{Model: "toy", Source: "pytorch", Mode: "simulated", Workers: p, Batch: 4, Params: params})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	g := make([]float32, 3072+7+1600)
	for st := 1; st <= s; st++ {
		for r := range p {
			for i := range g {
				g[i] = float32(rng.NormFloat64())
			}
			if err := w.Write(st, r, g); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := w.Commit(s, recorded.StepTime{Seconds: stepTime, Device: "cuda:0 (NVIDIA H100)"}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestMeasureRecorded measures a recording on the CPU: the step time is
// the given or the recorded one, every method's selection is measured on
// the recorded gradients, unions cover the recorded workers, and the kind
// is guessed from the names.
func TestMeasureRecorded(t *testing.T) {
	dir := writeRecording(t, 3, 2, 0.085)
	ctx := context.Background()
	h, err := MeasureRecorded(ctx, RecordedConfig{Dir: dir, Densities: []float64{0.01}, Methods: []string{"dense", "topk", "deft", "oktopk", "spardl"}})
	if err != nil {
		t.Fatal(err)
	}
	if h.Compute != 0.085 || h.StepSource != "recorded" || h.StepDevice != "cuda:0 (NVIDIA H100)" || h.Kind != Transformer || h.Layout.N != 4679 || h.GradStep != 2 || h.GradWorkers != 3 {
		t.Fatalf("host %+v", h)
	}
	if len(h.Selections) != 4 || len(h.Unions) != 1 || len(h.Unions[0].TopK) != 3 || !(h.Update > 0) || !(h.Other > 0) {
		t.Fatalf("selections %+v unions %+v update %v other %v", h.Selections, h.Unions, h.Update, h.Other)
	}
	for _, s := range h.Selections {
		if !(s.Seconds > 0) {
			t.Errorf("%s: selection time %v", s.Method, s.Seconds)
		}
	}
	// Independent random gradients: the union of 3 workers' top-k is
	// nearly 3k.
	if u := h.Unions[0].TopK; u[2] < 2.8*u[0] {
		t.Errorf("unions %v of independent gradients", u)
	}
	h2, err := MeasureRecorded(ctx, RecordedConfig{Dir: dir, StepTime: 20 * time.Millisecond, Densities: []float64{0.01}, Methods: []string{"topk"}, Kind: CNN, Step: 1})
	if err != nil {
		t.Fatal(err)
	}
	if h2.Compute != 0.02 || h2.StepSource != "given" || h2.Kind != CNN || h2.GradStep != 1 {
		t.Fatalf("host %+v", h2)
	}
	ranked, _, err := Rank(h2, Setting{Workers: 64, Density: 0.01}, []string{"dense", "topk"})
	if err != nil || len(ranked) != 2 {
		t.Fatalf("Rank: %v %v", ranked, err)
	}
	if _, err := MeasureRecorded(ctx, RecordedConfig{Dir: writeRecording(t, 2, 1, 0), Densities: []float64{0.01}, Methods: []string{"topk"}}); err == nil || !strings.Contains(err.Error(), "-step-time") {
		t.Errorf("a recording without a step time and no -step-time: %v", err)
	}
	if _, err := MeasureRecorded(ctx, RecordedConfig{Dir: dir, StepTime: time.Millisecond, Step: 3, Densities: []float64{0.01}}); err == nil || !strings.Contains(err.Error(), "steps 1 to 2") {
		t.Errorf("step 3 of 2: %v", err)
	}
}
