package data

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func smallImplicit(t testing.TB, seed uint64, n, users, items int) *Implicit {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	rs := randomRatings(r, n, users, items, 1)
	d, err := NewImplicit(rs, ImplicitConfig{EvalNegatives: 5, Seed: seed})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

type sample struct {
	u, i int32
	l    float32
}

func TestRecLoaderEvaluationOrderCoversEverything(t *testing.T) {
	d := smallImplicit(t, 31, 400, 15, 60)
	for _, neg := range []int{0, 1, 4} {
		for _, size := range sizes {
			for _, batch := range []int{1, 7, 64} {
				var all []sample
				for rank := 0; rank < size; rank++ {
					l, err := NewRecLoader(d, LoaderConfig{Batch: batch, Rank: rank, Size: size, Seed: 3}, neg)
					if err != nil {
						t.Fatal(err)
					}
					for i := 0; i < l.Len(); i++ {
						b, err := l.Batch(i)
						if err != nil {
							t.Fatal(err)
						}
						for k := 0; k < b.N; k++ {
							all = append(all, sample{b.Users[k], b.Items[k], b.Labels[k]})
						}
					}
					l.Close()
				}
				if len(all) != len(d.TrainUser)*(1+neg) {
					t.Fatalf("neg=%d size=%d batch=%d: %d samples, want %d", neg, size, batch, len(all), len(d.TrainUser)*(1+neg))
				}
				// Every positive exactly once, every negative an unrated item of its user.
				pos := map[[2]int32]int{}
				negs := 0
				for _, s := range all {
					if s.l == 1 {
						pos[[2]int32{s.u, s.i}]++
						continue
					}
					negs++
					if s.i < 0 || int(s.i) >= d.Items || slices.Contains(d.Rated(int(s.u)), s.i) {
						t.Fatalf("negative (%d,%d) is rated or out of range", s.u, s.i)
					}
				}
				for p := range d.TrainUser {
					if pos[[2]int32{d.TrainUser[p], d.TrainItem[p]}] != 1 {
						t.Fatalf("positive %d seen %d times", p, pos[[2]int32{d.TrainUser[p], d.TrainItem[p]}])
					}
				}
				if negs != neg*len(d.TrainUser) {
					t.Fatalf("%d negatives, want %d", negs, neg*len(d.TrainUser))
				}
			}
		}
	}
}

func TestRecLoaderTrainingShardsAndMix(t *testing.T) {
	d := smallImplicit(t, 32, 3000, 40, 300)
	const neg = 4
	for _, size := range sizes {
		for epoch := 0; epoch < 2; epoch++ {
			seen := map[int]bool{}
			for rank := 0; rank < size; rank++ {
				for _, workers := range []int{1, 2} {
					l, err := NewRecLoader(d, LoaderConfig{Batch: 16, Rank: rank, Size: size, Seed: 8, Train: true, Workers: workers}, neg)
					if err != nil {
						t.Fatal(err)
					}
					if err := l.SetEpoch(epoch); err != nil {
						t.Fatal(err)
					}
					shard, _ := NewShard(l.Samples(), rank, size, 8, epoch, true)
					if l.Len() != shard.Len()/16 {
						t.Fatalf("%d batches, want %d", l.Len(), shard.Len()/16)
					}
					positives := 0
					for i := 0; i < l.Len(); i++ {
						b, _ := l.Batch(i)
						for k := 0; k < b.N; k++ {
							j := shard.At(i*16 + k)
							if workers == 1 {
								if seen[j] {
									t.Fatalf("sample %d on two ranks", j)
								}
								seen[j] = true
							}
							// Reference: sample j is positive j/5 when j%5 == 0.
							p := j / (1 + neg)
							if b.Users[k] != d.TrainUser[p] {
								t.Fatalf("sample %d: user %d, want %d", j, b.Users[k], d.TrainUser[p])
							}
							if j%(1+neg) == 0 {
								if b.Labels[k] != 1 || b.Items[k] != d.TrainItem[p] {
									t.Fatalf("sample %d: want positive", j)
								}
								positives++
							} else if b.Labels[k] != 0 || slices.Contains(d.Rated(int(b.Users[k])), b.Items[k]) {
								t.Fatalf("sample %d: want an unrated negative, got item %d label %v", j, b.Items[k], b.Labels[k])
							}
							if u, it, lab := l.Sample(epoch, j); u != b.Users[k] || it != b.Items[k] || lab != b.Labels[k] {
								t.Fatal("Sample disagrees with Batch")
							}
						}
					}
					// The fix of the NCF bug: every rank sees about 1/5 positives.
					if n := l.Len() * 16; n >= 400 {
						if f := float64(positives) / float64(n); math.Abs(f-0.2) > 0.07 {
							t.Errorf("size=%d rank=%d: %.2f positives, want about 0.2", size, rank, f)
						}
					}
					l.Close()
				}
			}
		}
	}
	// Negatives change with the epoch.
	l, _ := NewRecLoader(d, LoaderConfig{Batch: 1, Size: 1, Seed: 8, Train: true}, neg)
	defer l.Close()
	same := 0
	for j := 1; j < 1000; j += 5 {
		_, a, _ := l.Sample(0, j)
		_, b, _ := l.Sample(1, j)
		if a == b {
			same++
		}
	}
	if same > 20 {
		t.Errorf("negatives of epochs 0 and 1 agree in %d of 200 samples", same)
	}
}

func TestRecLoaderNegativesUniform(t *testing.T) {
	d := smallImplicit(t, 33, 300, 5, 80)
	l, err := NewRecLoader(d, LoaderConfig{Batch: 1, Size: 1, Seed: 1, Train: true}, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// For user 0's first positive (sample 0), over many epochs, the negatives
	// at sample 1 are uniform over the user's unrated items.
	free := d.Items - len(d.Rated(0))
	counts := map[int32]int{}
	const draws = 40000
	for e := 0; e < draws; e++ {
		u, it, _ := l.Sample(e, 1)
		if u != 0 {
			t.Fatal("sample 1 is not user 0's")
		}
		counts[it]++
	}
	if len(counts) != free {
		t.Fatalf("%d distinct negatives, want %d", len(counts), free)
	}
	exp := float64(draws) / float64(free)
	var chi float64
	for _, c := range counts {
		chi += (float64(c) - exp) * (float64(c) - exp) / exp
	}
	df := float64(free - 1)
	if chi > df+6*math.Sqrt(2*df) {
		t.Errorf("chi-square %.1f for %v degrees of freedom", chi, df)
	}
}

func TestRecLoaderAllocationFree(t *testing.T) {
	d := smallImplicit(t, 34, 3000, 40, 300)
	l, err := NewRecLoader(d, LoaderConfig{Batch: 8192, Size: 1, Train: true, Workers: 2}, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	i := 0
	if a := testing.AllocsPerRun(20, func() { l.Batch(i % l.Len()); i++ }); a != 0 {
		t.Errorf("Batch allocates %v times, want 0", a)
	}
	if _, err := NewRecLoader(d, LoaderConfig{Batch: 1, Size: 1}, -1); err == nil {
		t.Error("negative negatives: no error")
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

func TestRealMovieLens100K(t *testing.T) {
	dir := needReal(t, "ml-100k")
	rs, err := ReadRatings(filepath.Join(dir, "u.data"), FormatAuto)
	if err != nil {
		t.Fatal(err)
	}
	users, items := map[int32]bool{}, map[int32]bool{}
	for _, r := range rs {
		users[r.User], items[r.Item] = true, true
	}
	if len(rs) != 100000 || len(users) != 943 || len(items) != 1682 {
		t.Errorf("%d ratings, %d users, %d items; want 100000, 943, 1682", len(rs), len(users), len(items))
	}
	d, err := LoadMovieLens(realData, "ml-100k", ImplicitConfig{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if d.Users != 943 || d.Items != 1682 || len(d.TestItem) != 943 || len(d.TrainUser) != 100000-943 {
		t.Errorf("split: %d users, %d items, %d test positives, %d training positives", d.Users, d.Items, len(d.TestItem), len(d.TrainUser))
	}
	if len(d.Eval) != 943*100 {
		t.Errorf("%d evaluation candidates, want 94300", len(d.Eval))
	}
}

// TestLoadMovieLensRefusesACutCopy: a ratings file of an official data
// set that is cut short at a line boundary (it parses) or modified is
// refused, naming what it holds and what the official file holds; the
// real ml-100k passes.
func TestLoadMovieLensRefusesACutCopy(t *testing.T) {
	dir := t.TempDir()
	putFile(t, filepath.Join(dir, "ml-1m", "ratings.dat"), []byte("1::1::5::1\n1::2::5::2\n2::1::3::1\n2::3::4::2\n"))
	if _, err := LoadMovieLens(dir, "ml-1m", ImplicitConfig{EvalNegatives: 1}); err == nil ||
		!errors.Is(err, ErrNotOfficial) || !strings.HasSuffix(err.Error(), "ratings.dat holds 4 ratings where the official ml-1m file holds 1000209: not the official file (cut short, or another file); delete the folder "+filepath.Join(dir, "ml-1m")+" and download the official archive again") {
		t.Errorf("a 4-line ml-1m: %v", err)
	}
	real := needReal(t, "ml-100k")
	b, err := os.ReadFile(filepath.Join(real, "u.data"))
	if err != nil {
		t.Fatal(err)
	}
	lines := bytes.SplitAfter(b, []byte("\n"))
	cut := bytes.Join(lines[:99_000], nil)
	putFile(t, filepath.Join(dir, "ml-100k", "u.data"), cut)
	if _, err := LoadMovieLens(dir, "ml-100k", ImplicitConfig{Seed: 1}); err == nil || !strings.Contains(err.Error(), "u.data holds 99000 ratings where the official ml-100k file holds 100000: not the official file") {
		t.Errorf("u.data cut at line 99,000: %v", err)
	}
	// All 100,000 lines, one rating changed.
	changed := bytes.Replace(b, []byte("\t3\t"), []byte("\t4\t"), 1)
	putFile(t, filepath.Join(dir, "ml-100k", "u.data"), changed)
	if _, err := LoadMovieLens(dir, "ml-100k", ImplicitConfig{Seed: 1}); err == nil || !strings.Contains(err.Error(), "where the official ml-100k file has 06416e597f82b7342361e41163890c81036900f418ad91315590814211dca490: not the official file (changed)") {
		t.Errorf("u.data with a rating changed: %v", err)
	}
	if _, err := LoadMovieLens(filepath.Dir(real), "ml-100k", ImplicitConfig{Seed: 1}); err != nil {
		t.Errorf("the official u.data: %v", err)
	}
}

func TestLoadMovieLensMissing(t *testing.T) {
	dir := t.TempDir()
	for name, want := range map[string]string{"ml-1m": `data.Download(ctx, "ml-1m"`, "ml-latest": "no automatic download"} {
		_, err := LoadMovieLens(dir, name, ImplicitConfig{})
		if !os.IsNotExist(unwrapAll(err)) && !strings.Contains(fmt.Sprint(err), "not exist") || !strings.Contains(fmt.Sprint(err), want) {
			t.Errorf("%s: %v, want a not-found error containing %q", name, err, want)
		}
	}
	putFile(t, filepath.Join(dir, "ml-latest", "ratings.csv"), []byte("userId,movieId,rating,timestamp\n1,1,4.0,1\n1,2,3.5,2\n2,2,1.0,1\n2,3,1.0,1\n"))
	d, err := LoadMovieLens(dir, "ml-latest", ImplicitConfig{EvalNegatives: 1})
	if err != nil || d.Users != 2 || d.Items != 3 {
		t.Fatalf("%v %+v", err, d)
	}
	putFile(t, filepath.Join(dir, "ml-1m", "ratings.dat"), []byte("1::1::5::1\n1::x::5::1\n"))
	if _, err := LoadMovieLens(dir, "ml-1m", ImplicitConfig{}); err == nil || !strings.Contains(err.Error(), "ratings.dat: line 2") {
		t.Errorf("malformed ratings.dat: %v", err)
	}
}
