package data

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"
)

// benchCIFAR returns a synthetic CIFAR-10 training set of n images (the real
// set when present would only change the pixel values, not the work).
func benchCIFAR(n int) *CIFAR {
	r := rand.New(rand.NewPCG(1, 1))
	c := &CIFAR{Kind: CIFAR10, Pixels: make([]byte, n*CIFARPixels), Labels: make([]int32, n)}
	for i := range c.Pixels {
		c.Pixels[i] = byte(r.Uint32())
	}
	for i := range c.Labels {
		c.Labels[i] = int32(r.IntN(10))
	}
	return c
}

// BenchmarkCIFARBatch measures training batch assembly with augmentation
// (shuffle, random crop with padding, flip, normalisation) of batches of 128
// images; images/s is the figure recorded in docs/bench/data.md
// (target: >= 20,000 images/s on the 2-core machine).
func BenchmarkCIFARBatch(b *testing.B) {
	ds := benchCIFAR(50000)
	for _, w := range []int{1, 2} {
		b.Run(map[int]string{1: "workers=1", 2: "workers=2"}[w], func(b *testing.B) {
			l, err := NewCIFARLoader(ds, LoaderConfig{Batch: 128, Size: 1, Seed: 1, Train: true, Workers: w})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.ReportAllocs()
			b.SetBytes(128 * CIFARPixels * 4)
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				if _, err := l.Batch(i % l.Len()); err != nil {
					b.Fatal(err)
				}
			}
			reportRates(b, float64(b.N)*128, cpu0, "images")
		})
	}
}

// benchImplicit is a synthetic MovieLens-1M-sized data set: 6,040 users,
// 3,706 items, about 1 M ratings.
func benchImplicit(b *testing.B) *Implicit {
	r := rand.New(rand.NewPCG(2, 2))
	rs := make([]Rating, 1000000)
	for i := range rs {
		rs[i] = Rating{User: 1 + int32(r.IntN(6040)), Item: 1 + int32(r.IntN(3706)), Rating: 4, Time: int64(i)}
	}
	d, err := NewImplicit(rs, ImplicitConfig{Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	return d
}

// BenchmarkRecBatch measures NCF training batch assembly (shuffled positives
// and sampled negatives, 4 per positive) in batches of 65,536 samples
// (2^20 global / 16 workers); target >= 1 M samples/s.
func BenchmarkRecBatch(b *testing.B) {
	d := benchImplicit(b)
	for _, w := range []int{1, 2} {
		b.Run(map[int]string{1: "workers=1", 2: "workers=2"}[w], func(b *testing.B) {
			l, err := NewRecLoader(d, LoaderConfig{Batch: 1 << 16, Size: 1, Seed: 1, Train: true, Workers: w}, 4)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cpuTime()
			for i := 0; i < b.N; i++ {
				if _, err := l.Batch(i % l.Len()); err != nil {
					b.Fatal(err)
				}
			}
			reportRates(b, float64(b.N)*(1<<16), cpu0, "samples")
		})
	}
}

// BenchmarkBPTTBatch measures one 30×32 BPTT window for rank 3 of 16.
func BenchmarkBPTTBatch(b *testing.B) {
	tokens := make([]int32, 2088628)
	l, err := NewBPTTLoader(tokens, BPTTConfig{Batch: 32, BPTT: 30, Rank: 3, Size: 16})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		l.Batch(i % l.Len())
	}
	b.ReportMetric(float64(b.N)*30*32/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkParseRatings measures parsing of u.data-format lines.
func BenchmarkParseRatings(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 3))
	text := []byte(formatRatings(randomRatings(r, 100000, 943, 1682, 1), FormatUData))
	b.SetBytes(int64(len(text)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := ParseRatings(bytesReader(text), "bench", FormatUData); err != nil {
			b.Fatal(err)
		}
	}
}

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }

// reportRates reports items per wall-clock second and per CPU second of the
// whole process (all loader goroutines together).
func reportRates(b *testing.B, items float64, cpu0 time.Duration, unit string) {
	b.ReportMetric(items/b.Elapsed().Seconds(), unit+"/s")
	if cpu := cpuTime() - cpu0; cpu > 0 {
		b.ReportMetric(items/cpu.Seconds(), unit+"/cpu-s")
	}
}
