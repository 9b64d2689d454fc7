package reports

import (
	"bytes"
	"context"
	"flag"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

var (
	bigOnce sync.Once
	bigDir  string
	bigErr  error
)

// bigRun writes a 100,000-step run once per test binary (TestMain removes
// it); tests that share it also share its parsed records (readMetrics).
func bigRun(t testing.TB) string {
	t.Helper()
	bigOnce.Do(func() {
		bigDir, bigErr = os.MkdirTemp("", "reports-big-")
		if bigErr == nil {
			writeBigRun(t, bigDir, 100000)
		}
	})
	if bigErr != nil {
		t.Fatal(bigErr)
	}
	return bigDir
}

func TestMain(m *testing.M) {
	flag.Parse()
	code := m.Run()
	if bigDir != "" {
		os.RemoveAll(bigDir)
	}
	os.Exit(code)
}

// BenchmarkReadRun100k parses the run.json and metrics.jsonl of a
// 100,000-step run (about 77 MB of JSON lines), cold (no cached records).
func BenchmarkReadRun100k(b *testing.B) {
	dir := bigRun(b)
	st, _ := os.Stat(filepath.Join(dir, "metrics.jsonl"))
	b.SetBytes(st.Size())
	for b.Loop() {
		metricsCache.Lock()
		forget(filepath.Join(dir, "metrics.jsonl"))
		metricsCache.Unlock()
		if _, err := ReadRun(dir); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRunPage100k builds every chart and renders the page of a
// 100,000-step run, the script referenced rather than inlined.
func BenchmarkRunPage100k(b *testing.B) {
	r, err := ReadRun(bigRun(b))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := RunPage(context.Background(), r, offline); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteRun100k is what train pays at every epoch of a
// 100,000-step run: read, chart, render with the script inlined, write.
func BenchmarkWriteRun100k(b *testing.B) {
	dir := bigRun(b)
	if _, err := ECharts(context.Background()); err != nil {
		b.Skip(err)
	}
	for b.Loop() {
		if err := WriteRunWith(context.Background(), dir, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDownsample1M reduces a series of 1,000,000 points to 5,000.
func BenchmarkDownsample1M(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	pts := make([]point, 1000000)
	for i := range pts {
		pts[i] = point{float64(i), rng.Float64()}
	}
	b.SetBytes(int64(len(pts)) * 16)
	for b.Loop() {
		downsample(pts, DefaultMaxPoints)
	}
}

// BenchmarkWriteRunEpoch is a report refresh of train on a 100,000-step run
// after one more epoch of 400 steps was appended: only the new lines are
// parsed (the run was read before), then charts, page and file.
func BenchmarkWriteRunEpoch(b *testing.B) {
	if _, err := ECharts(context.Background()); err != nil {
		b.Skip(err)
	}
	src := bigRun(b)
	dir := b.TempDir()
	for _, f := range []string{"run.json", "metrics.jsonl"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	data, _ := os.ReadFile(filepath.Join(src, "metrics.jsonl"))
	lines := bytes.SplitAfter(data, []byte("\n"))
	epoch := bytes.Join(lines[:400], nil)
	if err := WriteRunWith(context.Background(), dir, Options{}); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		b.StopTimer()
		f, err := os.OpenFile(filepath.Join(dir, "metrics.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			b.Fatal(err)
		}
		f.Write(epoch)
		f.Close()
		b.StartTimer()
		if err := WriteRunWith(context.Background(), dir, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}
