package reports

import (
	"context"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

var (
	bigOnce sync.Once
	bigDir  string
)

// bigRun writes a 100,000-step run once per test binary.
func bigRun(b *testing.B) string {
	bigOnce.Do(func() {
		d, err := os.MkdirTemp("", "reports-bench-")
		if err != nil {
			b.Fatal(err)
		}
		writeBigRun(b, d, 100000)
		bigDir = d
	})
	return bigDir
}

// BenchmarkReadRun100k parses the run.json and metrics.jsonl of a
// 100,000-step run (about 60 MB of JSON lines).
func BenchmarkReadRun100k(b *testing.B) {
	dir := bigRun(b)
	st, _ := os.Stat(filepath.Join(dir, "metrics.jsonl"))
	b.SetBytes(st.Size())
	for b.Loop() {
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
		if err := WriteRun(dir); err != nil {
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
