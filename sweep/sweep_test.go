package sweep

import (
	"bytes"
	"context"
	"errors"
	"html"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sparsegrad/sparsegrad/comm/netmodel"
	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
	"github.com/sparsegrad/sparsegrad/sparsify"
	"github.com/sparsegrad/sparsegrad/train"
)

func TestPoints(t *testing.T) {
	net := netmodel.Network{Latency: 50 * time.Microsecond, Bandwidth: 1e9 / 8}
	s := Spec{Base: train.Config{Model: "ncf", Steps: 10}, Sparsifiers: []string{"dense", "topk", "gtopk"},
		Workers: []int{1, 3, 4}, Densities: []float64{0.01, 0.1}, Networks: []netmodel.Network{{}, net}}
	pts, skipped, err := s.Points()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pts {
		names = append(names, p.Name)
		c := p.Config
		if c.Sparsifier != p.Method || c.Workers.Value() != p.Workers || c.NetBandwidth != p.Net.Bandwidth || c.NetLatency != p.Net.Latency || c.Steps != 10 {
			t.Errorf("%s: config %+v does not match the point", p.Name, c)
		}
		if p.Method == "dense" && c.Density.IsSet() {
			t.Errorf("%s: dense run with a density", p.Name)
		}
		if p.Method != "dense" && c.Density.Value() != p.Density {
			t.Errorf("%s: density %v, want %v", p.Name, c.Density, p.Density)
		}
	}
	// Dense once per worker count and network; gTop-k only on powers of two.
	want := []string{
		"dense-w1", "dense-w3", "dense-w4",
		"topk-w1-d0.01", "topk-w1-d0.1", "topk-w3-d0.01", "topk-w3-d0.1", "topk-w4-d0.01", "topk-w4-d0.1",
		"gtopk-w1-d0.01", "gtopk-w1-d0.1", "gtopk-w4-d0.01", "gtopk-w4-d0.1",
	}
	var all []string
	for _, w := range want {
		all = append(all, w)
	}
	for _, w := range want {
		all = append(all, w+"-1gbit-50us")
	}
	if !slices.Equal(names, all) {
		t.Errorf("points\n%v\nwant\n%v", names, all)
	}
	if len(skipped) != 4 {
		t.Errorf("skipped %v, want gtopk on 3 workers at 2 densities × 2 networks", skipped)
	}
	for _, sk := range skipped {
		if !strings.HasPrefix(sk.Name, "gtopk-w3") || !strings.Contains(sk.Reason.Error(), "power") {
			t.Errorf("skipped %s: %v", sk.Name, sk.Reason)
		}
	}
}

// TestPointsVariants: a variant runs its method with its options over the
// grid's, at every worker count and density, under its own label; bad
// labels and options are refused.
func TestPointsVariants(t *testing.T) {
	s := Spec{Base: train.Config{Model: "ncf", Steps: 10}, Sparsifiers: []string{"dense", "powersgd"}, Workers: []int{2, 3},
		Densities: []float64{0.1}, MethodOptions: sparsify.Values{"rank": 4},
		Variants: []Variant{{Label: "powersgd-rank1", Method: "powersgd", Options: sparsify.Values{"rank": 1}}}}
	pts, _, err := s.Points()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range pts {
		names = append(names, p.Name)
		want := map[string]int{"powersgd": 4, "powersgd-rank1": 1}[p.Method]
		if p.Method != "dense" && (p.Config.Sparsifier != "powersgd" || p.Config.MethodOptions["rank"] != want) {
			t.Errorf("%s: sparsifier %s with %v, want powersgd with rank %d", p.Name, p.Config.Sparsifier, p.Config.MethodOptions, want)
		}
	}
	if want := []string{"dense-w2", "dense-w3", "powersgd-w2-d0.1", "powersgd-w3-d0.1", "powersgd-rank1-w2-d0.1", "powersgd-rank1-w3-d0.1"}; !slices.Equal(names, want) {
		t.Errorf("points %v, want %v", names, want)
	}
	for _, c := range []struct {
		v    Variant
		want string
	}{
		{Variant{Label: "x", Method: "powersgdd"}, `unknown sparsifier "powersgdd"`},
		{Variant{Label: "topk", Method: "powersgd"}, "a label names its runs' folders"},
		{Variant{Label: "powersgd", Method: "powersgd"}, "a label names its runs' folders"},
		{Variant{Label: "a/b", Method: "powersgd"}, "a label names its runs' folders"},
		{Variant{Label: "x", Method: "powersgd", Options: sparsify.Values{"merge_size": 3}}, "powersgd has no option merge_size"},
	} {
		s := s
		s.Variants = []Variant{c.v}
		if _, _, err := s.Points(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("variant %+v: error %v, want one saying %q", c.v, err, c.want)
		}
	}
}

func TestPointsRefuse(t *testing.T) {
	base := Spec{Base: train.Config{Model: "ncf", Steps: 10}, Sparsifiers: []string{"topk"}, Workers: []int{2}, Densities: []float64{0.01}}
	for _, c := range []struct {
		edit func(*Spec)
		want string
	}{
		{func(s *Spec) { s.Sparsifiers = nil }, "grid is empty"},
		{func(s *Spec) { s.Sparsifiers = []string{"topq"} }, `unknown sparsifier "topq"`},
		{func(s *Spec) { s.Workers = []int{0} }, "at least 1"},
		{func(s *Spec) { s.Densities = []float64{1.5} }, "(0, 1]"},
		{func(s *Spec) { s.Densities = nil }, "at least one density"},
		{func(s *Spec) { s.MethodOptions = sparsify.Values{"merge_size": 10} }, "merge_size applies to lags"},
		{func(s *Spec) { s.Networks = []netmodel.Network{{Latency: time.Millisecond}} }, "bandwidth"},
		{func(s *Spec) { s.Sparsifiers, s.Workers = []string{"gtopk"}, []int{3, 5} }, "no point of the grid can run:\n  gtopk-w3-d0.01: "},
		{func(s *Spec) { s.Sparsifiers, s.Workers = []string{"gtopk"}, []int{3, 5} }, "\n  gtopk-w5-d0.01: "},
		// What train would refuse is refused before anything runs.
		{func(s *Spec) { s.Base.Model = "vgg" }, `topk-w2-d0.01: train: invalid configuration: unknown -model "vgg"`},
		{func(s *Spec) { s.Base.LR = train.Set(-1.0) }, "-lr -1 must be > 0"},
	} {
		s := base
		c.edit(&s)
		if _, _, err := s.Points(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want one saying %q", err, c.want)
		}
	}
}

// smallSpec is two methods × two worker counts of NCF on the real
// MovieLens-100K, 30 iterations each.
func smallSpec(data string) Spec {
	return Spec{Base: train.Config{Model: "ncf", Dataset: "ml-100k", DataDir: data, Steps: 30, Epochs: train.Set(100), EvalEvery: 15, MaxEvalBatches: 2},
		Sparsifiers: []string{"topk", "deft"}, Workers: []int{2, 3}, Densities: []float64{0.05}}
}

// logWatch is a sweep log that calls fn on every line.
type logWatch struct {
	mu  sync.Mutex
	buf bytes.Buffer
	fn  func(line string)
}

func (l *logWatch) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	for _, line := range strings.Split(strings.TrimSpace(string(p)), "\n") {
		if l.fn != nil {
			l.fn(line)
		}
	}
	return len(p), nil
}

func (l *logWatch) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestSweepResumes interrupts a sweep of two methods × two worker counts
// while its second run trains, checks what it left (the first run
// complete, the second started and not complete, nothing else), runs it
// again and checks that the first run was skipped (its files untouched),
// the second started again, the others run, and the page written with the
// four runs.
func TestSweepResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("trains NCF four times (about 10 s)")
	}
	data := testenv.SharedData(t, "ml-100k/u.data")
	out := t.TempDir()
	s := smallSpec(data)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	log := &logWatch{fn: func(line string) {
		if strings.HasPrefix(line, "[2/4]") && strings.HasSuffix(line, "running") {
			cancel() // as the second run starts: it is interrupted, whatever its speed
		}
	}}
	res, err := Run(ctx, s, out, Options{Log: log, NoPredict: true})
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "run the same command again") {
		t.Fatalf("interrupted sweep: %v (ran %d); log:\n%s", err, res.Ran, log)
	}
	first := filepath.Join(out, "runs", "topk-w2-d0.05")
	second := filepath.Join(out, "runs", "topk-w3-d0.05")
	mustExist(t, filepath.Join(first, completeFile))
	mustExist(t, filepath.Join(second, startedFile))
	if _, err := os.Stat(filepath.Join(second, completeFile)); err == nil {
		t.Fatalf("the interrupted run %s is marked complete", second)
	}
	for _, n := range []string{"deft-w2-d0.05", "deft-w3-d0.05"} {
		if _, err := os.Stat(filepath.Join(out, "runs", n)); err == nil {
			t.Errorf("%s exists after an interruption before it", n)
		}
	}
	before, err := os.ReadFile(filepath.Join(first, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	stBefore, _ := os.Stat(filepath.Join(first, "metrics.jsonl"))

	log2 := &logWatch{}
	res, err = Run(context.Background(), s, out, Options{Log: log2, NoPredict: true})
	if err != nil {
		t.Fatalf("continued sweep: %v; log:\n%s", err, log2)
	}
	if res.Ran != 3 || res.Complete != 1 {
		t.Errorf("continued sweep ran %d and found %d complete, want 3 and 1; log:\n%s", res.Ran, res.Complete, log2)
	}
	for _, want := range []string{"[1/4] topk-w2-d0.05: complete, skipped", "[2/4] topk-w3-d0.05: interrupted earlier; starting it again", "[4/4] deft-w3-d0.05: done"} {
		if !strings.Contains(log2.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, log2)
		}
	}
	after, _ := os.ReadFile(filepath.Join(first, "metrics.jsonl"))
	stAfter, _ := os.Stat(filepath.Join(first, "metrics.jsonl"))
	if !bytes.Equal(before, after) || !stBefore.ModTime().Equal(stAfter.ModTime()) {
		t.Errorf("the complete run's metrics.jsonl changed")
	}
	for _, n := range []string{"topk-w2-d0.05", "topk-w3-d0.05", "deft-w2-d0.05", "deft-w3-d0.05"} {
		mustExist(t, filepath.Join(out, "runs", n, completeFile))
		mustExist(t, filepath.Join(out, "runs", n, "metrics.jsonl"))
	}
	page, err := os.ReadFile(res.Page)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"topk ×2", "topk ×3", "deft ×2", "deft ×3", "sweep-density", "sweep-phases"} {
		if !bytes.Contains(page, []byte(n)) {
			t.Errorf("the page lacks %q", n)
		}
	}

	// A third call runs nothing, and judges a preset's claims on the real
	// runs: one DEFT must show (its actual density is the setup density),
	// one that cannot hold (Top-k's density at most a tenth of ρ) must not;
	// the page and the result state both with their numbers.
	claims := []Claim{
		{"DEFT sends the setup density.", nearSetup([]string{"deft"}, 0.5, 0.5, 1.1)},
		{"Top-k sends a tenth of it.", nearSetup([]string{"topk"}, 0.5, 0, 0.1)},
	}
	res, err = Run(context.Background(), s, out, Options{NoPredict: true, Claims: claims})
	if err != nil || res.Ran != 0 || res.Complete != 4 {
		t.Errorf("third call: ran %d, complete %d, err %v; want 0, 4, nil", res.Ran, res.Complete, err)
	}
	if len(res.Verdicts) != 2 || !strings.Contains(res.Verdicts[0], "DEFT sends the setup density. This sweep: shown: actual density") ||
		!strings.Contains(res.Verdicts[1], "This sweep: not shown: actual density") {
		t.Errorf("verdicts %q", res.Verdicts)
	}
	page, err = os.ReadFile(res.Page)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Verdicts {
		if !bytes.Contains(page, []byte(html.EscapeString(v))) {
			t.Errorf("the page lacks the verdict %q", v)
		}
	}

	// A larger budget conflicts with the completed runs, and says how.
	s2 := s
	s2.Base.Steps = 40
	if _, err := Run(context.Background(), s2, out, Options{NoPredict: true}); err == nil || !strings.Contains(err.Error(), "steps 30, now 40") {
		t.Errorf("changed budget: %v, want an error naming steps 30, now 40", err)
	}
}

// TestSweepLeavesForeignFolders checks that a run folder the sweep did not
// make stops it and stays as it was.
func TestSweepLeavesForeignFolders(t *testing.T) {
	out := t.TempDir()
	s := Spec{Base: train.Config{Model: "ncf", Steps: 5}, Sparsifiers: []string{"topk"}, Workers: []int{2}, Densities: []float64{0.05}}
	dir := filepath.Join(out, "runs", "topk-w2-d0.05")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	keep := filepath.Join(dir, "run.json")
	if err := os.WriteFile(keep, []byte(`{"config":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Run(context.Background(), s, out, Options{NoPredict: true})
	if err == nil || !strings.Contains(err.Error(), "was not made by this sweep") {
		t.Fatalf("foreign folder: %v", err)
	}
	if b, err := os.ReadFile(keep); err != nil || string(b) != `{"config":{}}` {
		t.Errorf("the foreign folder was touched: %q %v", b, err)
	}
}

func mustExist(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Stat(p); err != nil {
		t.Errorf("%s: %v", p, err)
	}
}

// TestPresetsAreValid expands every preset's grid and checks that each runs
// NCF on MovieLens-100K with a budget, and documents a full-size command.
func TestPresetsAreValid(t *testing.T) {
	for _, name := range PresetNames() {
		p := Presets[name]
		pts, _, err := p.Spec.Points()
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if p.Spec.Base.Model != "ncf" || p.Spec.Base.Dataset != "ml-100k" || (p.Spec.Base.Steps == 0 && p.Spec.Base.MaxTime == 0) {
			t.Errorf("%s: base %+v, want NCF on ml-100k with a budget", name, p.Spec.Base)
		}
		if !strings.HasPrefix(p.FullSize, "train sweep -preset "+name+" ") || p.Name != name || p.Doc == "" || p.Paper == "" {
			t.Errorf("%s: incomplete preset %+v", name, p)
		}
		if len(pts) < 4 {
			t.Errorf("%s: %d runs", name, len(pts))
		}
	}
	if _, err := LookupPreset("nope"); err == nil || !strings.Contains(err.Error(), "deft-buildup") {
		t.Errorf("unknown preset: %v", err)
	}
}

// TestConfigDiffFillsDefaults: a run completed before an option became one
// of the sweep's flags recorded it unset; the grid now asks for its
// default, which is the same run. Another value is not.
func TestConfigDiffFillsDefaults(t *testing.T) {
	var old, now, off train.Config
	now.Set("pipeline", "auto")
	off.Set("pipeline", "off")
	if d := configDiff(old, now); d != "" {
		t.Errorf("unset against its default: %q, want no difference", d)
	}
	if d := configDiff(old, off); !strings.Contains(d, "pipeline auto, now off") {
		t.Errorf("unset against off: %q, want the pipeline named", d)
	}
}
