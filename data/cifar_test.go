package data

import (
	"bytes"
	"errors"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sparsegrad/sparsegrad/internal/testsupport/testenv"
)

// realData is the shared folder of real data sets, relative to this package.
const realData = "../../shared/data"

// needReal returns the real data path sub; missing data skips the test, or
// fails it under SPARSEGRAD_REQUIRE=data (testenv.DataDir). The tests read
// ../shared/data relative to the repository root.
func needReal(t testing.TB, sub string) string {
	t.Helper()
	return filepath.Join(testenv.DataDir(t, realData, sub), sub)
}

// makeCIFAR returns n random records of kind in the binary format and the
// labels written.
func makeCIFAR(r *rand.Rand, kind CIFARKind, n int) (raw []byte, fine, coarse []int32) {
	for i := 0; i < n; i++ {
		if kind == CIFAR100 {
			c, f := r.IntN(20), r.IntN(100)
			raw = append(raw, byte(c), byte(f))
			coarse, fine = append(coarse, int32(c)), append(fine, int32(f))
		} else {
			l := r.IntN(10)
			raw = append(raw, byte(l))
			fine = append(fine, int32(l))
		}
		for p := 0; p < CIFARPixels; p++ {
			raw = append(raw, byte(r.IntN(256)))
		}
	}
	return raw, fine, coarse
}

func putFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestReadCIFARFile(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, kind := range []CIFARKind{CIFAR10, CIFAR100} {
		for _, n := range []int{1, 2, 7} {
			raw, fine, coarse := makeCIFAR(r, kind, n)
			p := filepath.Join(t.TempDir(), "f.bin")
			putFile(t, p, raw)
			c, err := ReadCIFARFile(p, kind)
			if err != nil {
				t.Fatal(err)
			}
			if c.Len() != n {
				t.Fatalf("%v n=%d: read %d", kind, n, c.Len())
			}
			rec := kind.RecordSize()
			for i := 0; i < n; i++ {
				if c.Labels[i] != fine[i] || (kind == CIFAR100 && c.Coarse[i] != coarse[i]) {
					t.Fatalf("record %d labels differ", i)
				}
				if !bytes.Equal(c.Pixels[i*CIFARPixels:(i+1)*CIFARPixels], raw[i*rec+rec-CIFARPixels:(i+1)*rec]) {
					t.Fatalf("record %d pixels differ", i)
				}
			}
			if kind == CIFAR10 && c.Coarse != nil {
				t.Fatal("CIFAR-10 has coarse labels")
			}
		}
	}
}

func TestCIFARBadFiles(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	raw10, _, _ := makeCIFAR(r, CIFAR10, 3)
	raw100, _, _ := makeCIFAR(r, CIFAR100, 3)
	// 3,073 CIFAR-100 records are also 3,074 whole CIFAR-10 records: the labels catch it.
	raw100big, _, _ := makeCIFAR(r, CIFAR100, 3073)
	raw100big[0] = 19
	badLabel := append([]byte(nil), raw10...)
	badLabel[3073] = 10
	bad100 := append([]byte(nil), raw100[:3*3074]...)
	bad100[3074] = 25 // coarse label of record 1
	dir := t.TempDir()
	cases := []struct {
		name string
		data []byte
		kind CIFARKind
		want string
	}{
		{"empty.bin", nil, CIFAR10, "empty file"},
		{"truncated.bin", raw10[:len(raw10)-100], CIFAR10, "truncated"},
		{"c100.bin", raw100, CIFAR10, "looks like a CIFAR-100 file"},
		{"c100big.bin", raw100big, CIFAR10, "label 19, want 0..9"},
		{"label.bin", badLabel, CIFAR10, "record 1"},
		{"coarse.bin", bad100, CIFAR100, "coarse label 25"},
		{"c10as100.bin", raw10[:3074*0+3073*2], CIFAR100, "not a whole number"},
	}
	for _, c := range cases {
		p := filepath.Join(dir, c.name)
		putFile(t, p, c.data)
		_, err := ReadCIFARFile(p, c.kind)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: error %v, want one naming the file and %q", c.name, err, c.want)
		}
	}
	if _, err := ReadCIFARFile(dir, CIFAR10); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Errorf("directory: %v", err)
	}
}

func TestLoadCIFAR(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	root := t.TempDir()
	_, err := LoadCIFAR(root, CIFAR10, Train)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "-download") {
		t.Fatalf("missing data: %v, want ErrNotExist with a download hint", err)
	}
	// A test file with the wrong count is refused by LoadCIFAR but read by ReadCIFARFile.
	raw, _, _ := makeCIFAR(r, CIFAR10, 5)
	putFile(t, filepath.Join(root, "cifar-10-batches-bin", "test_batch.bin"), raw)
	if _, err := LoadCIFAR(root, CIFAR10, Test); err == nil || !strings.Contains(err.Error(), "5 records, want 10000") {
		t.Fatalf("short test file: %v", err)
	}
	if _, err := LoadCIFAR(root, CIFAR10, Valid); err == nil {
		t.Fatal("CIFAR valid split: no error")
	}
	if testing.Short() {
		return
	}
	raw, fine, coarse := makeCIFAR(r, CIFAR100, 10000)
	putFile(t, filepath.Join(root, "cifar-100-binary", "test.bin"), raw)
	for _, dir := range []string{root, filepath.Join(root, "cifar-100-binary")} {
		c, err := LoadCIFAR(dir, CIFAR100, Test)
		if err != nil {
			t.Fatal(err)
		}
		if c.Len() != 10000 || c.Labels[9999] != fine[9999] || c.Coarse[17] != coarse[17] {
			t.Fatal("CIFAR-100 test set read wrongly")
		}
	}
}

// refImage is the obvious augmentation: pad with zeros to 40×40, crop at
// (dx, dy), flip, normalise.
func refImage(src []byte, kind CIFARKind, dx, dy int, flip, augment bool) []float32 {
	mean, std := kind.Mean(), kind.Std()
	out := make([]float32, CIFARPixels)
	for c := 0; c < 3; c++ {
		var pad [40][40]byte
		for y := 0; y < 32; y++ {
			for x := 0; x < 32; x++ {
				pad[y+4][x+4] = src[c*1024+y*32+x]
			}
		}
		for y := 0; y < 32; y++ {
			for x := 0; x < 32; x++ {
				v := src[c*1024+y*32+x]
				if augment {
					cx := x
					if flip {
						cx = 31 - x
					}
					v = pad[y+dy][cx+dx]
				}
				out[c*1024+y*32+x] = (float32(v)/255 - mean[c]) / std[c]
			}
		}
	}
	return out
}

func TestCIFARLoaderMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, kind := range []CIFARKind{CIFAR10, CIFAR100} {
		n := 53
		raw, _, _ := makeCIFAR(r, kind, n)
		ds, err := ParseCIFAR(bytes.NewReader(raw), "mem", kind, int64(len(raw)))
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range sizes {
			for _, batch := range []int{1, 4, 7} {
				for _, train := range []bool{true, false} {
					prefetch := batch == 4 // the next batch assembled in the background: the same batches
					seen := map[int32]bool{}
					for rank := 0; rank < size; rank++ {
						l, err := NewCIFARLoader(ds, LoaderConfig{Batch: batch, Rank: rank, Size: size, Seed: 99, Train: train, Workers: 2, Prefetch: prefetch})
						if train && n/size < batch {
							if err == nil {
								t.Fatalf("size=%d batch=%d: no full batch but no error", size, batch)
							}
							continue
						}
						if err != nil {
							t.Fatal(err)
						}
						for epoch := 0; epoch < 2; epoch++ {
							if err := l.SetEpoch(epoch); err != nil {
								t.Fatal(err)
							}
							shard, _ := NewShard(n, rank, size, 99, epoch, train)
							wantBatches := shard.Len() / batch
							if !train {
								wantBatches = (shard.Len() + batch - 1) / batch
							}
							if l.Len() != wantBatches {
								t.Fatalf("Len %d, want %d", l.Len(), wantBatches)
							}
							for i := 0; i < l.Len(); i++ {
								b, err := l.Batch(i)
								if err != nil {
									t.Fatal(err)
								}
								for j := 0; j < b.N; j++ {
									idx := shard.At(i*batch + j)
									if int(b.Index[j]) != idx || b.Labels[j] != ds.Labels[idx] {
										t.Fatalf("batch %d item %d: index %d label %d, want %d %d", i, j, b.Index[j], b.Labels[j], idx, ds.Labels[idx])
									}
									if kind == CIFAR100 && b.Coarse[j] != ds.Coarse[idx] {
										t.Fatal("coarse label differs")
									}
									dx, dy, flip := CIFARAugment(99, epoch, idx)
									want := refImage(ds.Pixels[idx*CIFARPixels:(idx+1)*CIFARPixels], kind, dx, dy, flip, train)
									got := b.X[j*CIFARPixels : (j+1)*CIFARPixels]
									for p := range want {
										if math.Abs(float64(got[p]-want[p])) > 1e-6 {
											t.Fatalf("%v size=%d batch=%d train=%v image %d pixel %d: %v want %v (dx=%d dy=%d flip=%v)", kind, size, batch, train, idx, p, got[p], want[p], dx, dy, flip)
										}
									}
									if epoch == 0 {
										if seen[int32(idx)] {
											t.Fatalf("image %d served twice in one epoch", idx)
										}
										seen[int32(idx)] = true
									}
								}
							}
						}
						if _, err := l.Batch(l.Len()); err == nil {
							t.Fatal("batch out of range: no error")
						}
						l.Close()
					}
				}
			}
		}
	}
}

// TestCIFARLoaderPrefetch: with Prefetch the loader serves the batches it
// serves without, in any order of calls (a resume starts mid-epoch, a new
// epoch interrupts one), and a batch asked for in order was assembled in
// the background while the caller held the previous one.
func TestCIFARLoaderPrefetch(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	raw, _, _ := makeCIFAR(r, CIFAR10, 120)
	ds, err := ParseCIFAR(bytes.NewReader(raw), "mem", CIFAR10, int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := LoaderConfig{Batch: 8, Rank: 1, Size: 2, Seed: 5, Train: true, Workers: 3}
	plain, err := NewCIFARLoader(ds, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	cfg.Prefetch = true
	ahead, err := NewCIFARLoader(ds, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ahead.Close()
	// (epoch, batch) calls: in order, a jump, back, a new epoch mid-way.
	calls := [][2]int{{0, 0}, {0, 1}, {0, 2}, {0, 5}, {0, 6}, {0, 3}, {0, 4}, {1, 2}, {1, 3}, {1, 4}, {0, 0}, {0, 1}}
	epoch := -1
	for _, c := range calls {
		if c[0] != epoch {
			epoch = c[0]
			if err := plain.SetEpoch(epoch); err != nil {
				t.Fatal(err)
			}
			if err := ahead.SetEpoch(epoch); err != nil {
				t.Fatal(err)
			}
		}
		want, err := plain.Batch(c[1])
		if err != nil {
			t.Fatal(err)
		}
		got, err := ahead.Batch(c[1])
		if err != nil {
			t.Fatal(err)
		}
		if got.N != want.N || !slices.Equal(got.X, want.X) || !slices.Equal(got.Labels, want.Labels) || !slices.Equal(got.Index, want.Index) {
			t.Fatalf("epoch %d batch %d: the prefetching loader's batch differs", c[0], c[1])
		}
	}
	// In order: every batch but the first of each run came from the
	// background (0→1→2, 5→6, 3→4, 2→3→4, 0→1).
	if ahead.prefetched != 7 {
		t.Fatalf("%d batches were assembled in the background, want 7", ahead.prefetched)
	}
}

func TestCIFARAugmentCoversAllCrops(t *testing.T) {
	var seen [9][9][2]int
	for i := 0; i < 20000; i++ {
		dx, dy, flip := CIFARAugment(1, 2, i)
		f := 0
		if flip {
			f = 1
		}
		seen[dx][dy][f]++
	}
	for dx := range seen {
		for dy := range seen[dx] {
			for f := range seen[dx][dy] {
				if c := seen[dx][dy][f]; c < 60 || c > 200 {
					t.Errorf("crop (%d,%d) flip %d drawn %d times of 20000, want about 123", dx, dy, f, c)
				}
			}
		}
	}
	a1, b1, c1 := CIFARAugment(1, 0, 5)
	a2, b2, c2 := CIFARAugment(1, 0, 5)
	if a1 != a2 || b1 != b2 || c1 != c2 {
		t.Fatal("augmentation not deterministic")
	}
}

func TestCIFARLoaderAllocationFree(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	raw, _, _ := makeCIFAR(r, CIFAR10, 300)
	ds, err := ParseCIFAR(bytes.NewReader(raw), "mem", CIFAR10, int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewCIFARLoader(ds, LoaderConfig{Batch: 64, Size: 1, Train: true, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	i := 0
	allocs := testing.AllocsPerRun(50, func() {
		if _, err := l.Batch(i % l.Len()); err != nil {
			t.Fatal(err)
		}
		i++
	})
	if allocs != 0 {
		t.Errorf("Batch allocates %v times per call, want 0", allocs)
	}
}

func TestCIFARLoaderConfigErrors(t *testing.T) {
	ds := &CIFAR{Pixels: make([]byte, CIFARPixels), Labels: []int32{0}}
	for _, cfg := range []LoaderConfig{{Batch: 0, Size: 1}, {Batch: 1, Size: 0}, {Batch: 1, Size: 2, Rank: 2}, {Batch: 1, Size: 1, Workers: -1}} {
		if _, err := NewCIFARLoader(ds, cfg); err == nil {
			t.Errorf("%+v: no error", cfg)
		}
	}
	if _, err := NewCIFARLoader(&CIFAR{}, LoaderConfig{Batch: 1, Size: 1}); err == nil {
		t.Error("empty data set: no error")
	}
}

func TestRealCIFAR10(t *testing.T) {
	dir := needReal(t, "cifar-10-batches-bin")
	if testing.Short() {
		t.Skip("reads 150 MB; skipped with -short")
	}
	c, err := LoadCIFAR(realData, CIFAR10, Train)
	if err != nil {
		t.Fatal(err)
	}
	if c.Len() != 50000 {
		t.Fatalf("%d training images, want 50000", c.Len())
	}
	var per [10]int
	for _, l := range c.Labels {
		per[l]++
	}
	for k, n := range per {
		if n != 5000 {
			t.Errorf("class %d has %d images, want 5000", k, n)
		}
	}
	meta, err := os.ReadFile(filepath.Join(dir, "batches.meta.txt"))
	if err != nil {
		t.Fatal(err)
	}
	names := strings.Fields(string(meta)) // one class name a line, no spaces
	if c.Labels[0] != 6 || names[6] != "frog" {
		t.Errorf("first label %d (%s), want 6 (frog)", c.Labels[0], names[c.Labels[0]])
	}
	test, err := ReadCIFARFile(filepath.Join(dir, "test_batch.first1000.bin"), CIFAR10)
	if err != nil {
		t.Fatal(err)
	}
	if test.Len() != 1000 {
		t.Errorf("test subset: %d images, want 1000", test.Len())
	}
	// The per-channel mean of the training set is the normalisation mean.
	mean := CIFAR10.Mean()
	for ch := 0; ch < 3; ch++ {
		var s float64
		for i := 0; i < c.Len(); i++ {
			for _, v := range c.Pixels[i*CIFARPixels+ch*1024 : i*CIFARPixels+(ch+1)*1024] {
				s += float64(v)
			}
		}
		if m := s / float64(c.Len()*1024) / 255; math.Abs(m-float64(mean[ch])) > 1e-3 {
			t.Errorf("channel %d mean %.4f, want %.4f", ch, m, mean[ch])
		}
	}
}

func TestLoaderTooSmallForOneBatch(t *testing.T) {
	ds := &CIFAR{Pixels: make([]byte, 10*CIFARPixels), Labels: make([]int32, 10)}
	_, err := NewCIFARLoader(ds, LoaderConfig{Batch: 4, Size: 3, Train: true})
	if err == nil || !strings.Contains(err.Error(), "fewer than the batch size 4") {
		t.Fatalf("%v", err)
	}
	if l, err := NewCIFARLoader(ds, LoaderConfig{Batch: 4, Size: 3}); err != nil || l.Len() != 1 {
		t.Fatalf("evaluation loader: %v", err)
	}
}

// TestLoadersSizeBeforeAllocating: a batch of 2^40 is refused for
// training, and serves the whole split for evaluation, without allocating
// 2^40 samples' buffers (which panicked or ran out of memory).
func TestLoadersSizeBeforeAllocating(t *testing.T) {
	const huge = 1 << 40
	ds := &CIFAR{Pixels: make([]byte, 10*CIFARPixels), Labels: make([]int32, 10)}
	if _, err := NewCIFARLoader(ds, LoaderConfig{Batch: huge, Size: 3, Train: true}); err == nil || !strings.Contains(err.Error(), "fewer than the batch size") {
		t.Errorf("CIFAR training loader: %v", err)
	}
	l, err := NewCIFARLoader(ds, LoaderConfig{Batch: huge, Size: 3, Rank: 1})
	if err != nil || l.Len() != 1 {
		t.Fatalf("CIFAR evaluation loader: %v", err)
	}
	if b, err := l.Batch(0); err != nil || b.N != 3 || len(b.X) != 3*CIFARPixels {
		t.Errorf("CIFAR evaluation batch: %v", err)
	}
	l.Close()
	rec := smallImplicit(t, 31, 400, 15, 60)
	if _, err := NewRecLoader(rec, LoaderConfig{Batch: huge, Size: 2, Train: true}, 4); err == nil || !strings.Contains(err.Error(), "fewer than the batch size") {
		t.Errorf("MovieLens training loader: %v", err)
	}
	r, err := NewRecLoader(rec, LoaderConfig{Batch: huge, Size: 2}, 4)
	if err != nil || r.Len() != 1 {
		t.Fatalf("MovieLens evaluation loader: %v", err)
	}
	if b, err := r.Batch(0); err != nil || b.N != r.shard.Len() {
		t.Errorf("MovieLens evaluation batch: %v", err)
	}
	r.Close()
}

func TestCIFARLoaderDeterministic(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	raw, _, _ := makeCIFAR(r, CIFAR10, 200)
	ds, err := ParseCIFAR(bytes.NewReader(raw), "mem", CIFAR10, int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	batch := func(seed uint64, epoch, workers int) []float32 {
		l, err := NewCIFARLoader(ds, LoaderConfig{Batch: 50, Rank: 1, Size: 3, Seed: seed, Train: true, Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if err := l.SetEpoch(epoch); err != nil {
			t.Fatal(err)
		}
		b, err := l.Batch(0)
		if err != nil {
			t.Fatal(err)
		}
		return slices.Clone(b.X)
	}
	a := batch(1, 2, 1)
	if !slices.Equal(a, batch(1, 2, 2)) || !slices.Equal(a, batch(1, 2, 3)) {
		t.Error("batch depends on the number of goroutines")
	}
	if !slices.Equal(a, batch(1, 2, 1)) {
		t.Error("batch differs between runs with the same seed and epoch")
	}
	if slices.Equal(a, batch(1, 3, 1)) || slices.Equal(a, batch(2, 2, 1)) {
		t.Error("batch does not change with the epoch or the seed")
	}
}
