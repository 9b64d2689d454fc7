package data

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// ImplicitConfig configures the implicit-feedback view of a ratings file.
type ImplicitConfig struct {
	// MinRatings drops users with fewer ratings (20 for ml-20m, as in NCF).
	// Users with fewer than 2 ratings are always dropped: leave-one-out needs
	// a test positive and at least one training positive.
	MinRatings int
	// EvalNegatives is the number of sampled negatives per user among the
	// evaluation candidates; 0 means 99 (100 candidates with the positive,
	// as in NCF). The DEFT code uses 100.
	EvalNegatives int
	// Seed fixes the evaluation candidates.
	Seed uint64
}

// Implicit is a MovieLens data set as implicit feedback with a leave-one-out
// split: users and items re-indexed densely (0..Users-1, 0..Items-1, in
// ascending order of the original ids), every rating a positive, each user's
// last interaction by timestamp the test positive and the others the training
// positives.
type Implicit struct {
	Users, Items int
	UserIDs      []int32 // original id of each user
	ItemIDs      []int32 // original id of each item
	// TrainUser[p], TrainItem[p] is training positive p; grouped by user in
	// ascending order, each user's positives in time order.
	TrainUser, TrainItem []int32
	// TestItem[u] is user u's held-out positive.
	TestItem []int32
	// EvalNegatives is the number of negatives per user in Eval.
	EvalNegatives int
	// Eval holds Users×(1+EvalNegatives) evaluation candidates: for user u,
	// Eval[u*(1+EvalNegatives)] is the test positive, followed by
	// EvalNegatives distinct items the user has not rated (for data built
	// from NCF files: the file's negatives, which may repeat).
	Eval []int32
	// rated[ratedOff[u]:ratedOff[u+1]] are the items user u rated (training
	// and test), ascending and distinct.
	ratedOff []int32
	rated    []int32
}

// Rated returns the items user u has rated (training and test), ascending.
// The slice must not be modified.
func (d *Implicit) Rated(u int) []int32 { return d.rated[d.ratedOff[u]:d.ratedOff[u+1]] }

// Candidates returns user u's evaluation candidates (positive first).
func (d *Implicit) Candidates(u int) []int32 {
	k := 1 + d.EvalNegatives
	return d.Eval[u*k : (u+1)*k]
}

// unrated returns the k-th (0-based) item that user u has not rated: with
// rated items r_0 < r_1 < ..., it is k plus the number of j with r_j - j <= k.
func (d *Implicit) unrated(u int, k int32) int32 {
	r := d.rated[d.ratedOff[u]:d.ratedOff[u+1]]
	lo, hi := 0, len(r)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r[m]-int32(m) <= k {
			lo = m + 1
		} else {
			hi = m
		}
	}
	return k + int32(lo)
}

// NewImplicit builds the implicit-feedback data set from explicit ratings.
// Duplicate (user, item) pairs keep their first interaction in time; ties in
// time keep file order. The evaluation negatives of user u are drawn without
// replacement, uniformly from the items u has not rated, with a generator
// keyed by (cfg.Seed, u), so they are the same in every run with that seed.
func NewImplicit(ratings []Rating, cfg ImplicitConfig) (*Implicit, error) {
	if cfg.EvalNegatives < 0 || cfg.MinRatings < 0 {
		return nil, fmt.Errorf("data: EvalNegatives %d and MinRatings %d must not be negative", cfg.EvalNegatives, cfg.MinRatings)
	}
	if cfg.EvalNegatives == 0 {
		cfg.EvalNegatives = 99
	}
	if len(ratings) == 0 {
		return nil, errors.New("data: no ratings")
	}
	order := orderByUserTime(ratings)
	minR := max(cfg.MinRatings, 2)
	// Per user: distinct items in time order.
	type span struct{ lo, hi int }
	var users []span
	kept := order[:0:0]
	seen := make(map[int32]struct{})
	for lo := 0; lo < len(order); {
		u := ratings[order[lo]].User
		hi := lo
		for hi < len(order) && ratings[order[hi]].User == u {
			hi++
		}
		clear(seen)
		start := len(kept)
		for _, o := range order[lo:hi] {
			if _, dup := seen[ratings[o].Item]; !dup {
				seen[ratings[o].Item] = struct{}{}
				kept = append(kept, o)
			}
		}
		if len(kept)-start >= minR {
			users = append(users, span{start, len(kept)})
		} else {
			kept = kept[:start]
		}
		lo = hi
	}
	if len(users) == 0 {
		return nil, fmt.Errorf("data: no user has at least %d distinct rated items: the ratings file is truncated or not the data set it is named after; fetch it again (train -download)", minR)
	}
	itemSet := make(map[int32]int32)
	for _, o := range kept {
		itemSet[ratings[o].Item] = 0
	}
	d := &Implicit{Users: len(users), Items: len(itemSet), EvalNegatives: cfg.EvalNegatives}
	d.ItemIDs = slices.Sorted(maps.Keys(itemSet))
	for i, it := range d.ItemIDs {
		itemSet[it] = int32(i)
	}
	d.UserIDs = make([]int32, len(users))
	d.TestItem = make([]int32, len(users))
	d.ratedOff = make([]int32, len(users)+1)
	d.TrainUser = make([]int32, 0, len(kept)-len(users))
	d.TrainItem = make([]int32, 0, len(kept)-len(users))
	d.rated = make([]int32, 0, len(kept))
	for u, s := range users {
		d.UserIDs[u] = ratings[kept[s.lo]].User
		for _, o := range kept[s.lo : s.hi-1] {
			d.TrainUser = append(d.TrainUser, int32(u))
			d.TrainItem = append(d.TrainItem, itemSet[ratings[o].Item])
		}
		d.TestItem[u] = itemSet[ratings[kept[s.hi-1]].Item]
		start := len(d.rated)
		for _, o := range kept[s.lo:s.hi] {
			d.rated = append(d.rated, itemSet[ratings[o].Item])
		}
		slices.Sort(d.rated[start:])
		d.ratedOff[u+1] = int32(len(d.rated))
	}
	if err := d.sampleEval(cfg.Seed); err != nil {
		return nil, err
	}
	return d, nil
}

// sampleEval draws each user's evaluation negatives (Floyd's algorithm over
// the user's unrated items).
func (d *Implicit) sampleEval(seed uint64) error {
	k := 1 + d.EvalNegatives
	d.Eval = make([]int32, d.Users*k)
	chosen := make([]int32, 0, d.EvalNegatives)
	for u := 0; u < d.Users; u++ {
		free := d.Items - len(d.Rated(u))
		if free < d.EvalNegatives {
			return fmt.Errorf("data: user %d (original id %d) has rated %d of %d items, leaving %d unrated: too few for %d distinct evaluation negatives; lower EvalNegatives",
				u, d.UserIDs[u], len(d.Rated(u)), d.Items, free, d.EvalNegatives)
		}
		r := newRNG(key(seed, tagEval, uint64(u)))
		chosen = chosen[:0]
		for j := free - d.EvalNegatives; j < free; j++ {
			t := int32(r.intn(uint64(j + 1)))
			if slices.Contains(chosen, t) {
				t = int32(j)
			}
			chosen = append(chosen, t)
		}
		c := d.Eval[u*k : (u+1)*k]
		c[0] = d.TestItem[u]
		for i, t := range chosen {
			c[1+i] = d.unrated(u, t)
		}
	}
	return nil
}

// LoadMovieLens reads a MovieLens ratings file from dir, which is the
// extracted folder (ml-100k/, ml-1m/, ml-20m/, ml-latest/...) or its parent
// together with name: it looks for u.data, ratings.dat, then ratings.csv.
// name ("ml-100k", "ml-1m", "ml-20m") is used for the folder and the download
// hint.
func LoadMovieLens(dir, name string, cfg ImplicitConfig) (*Implicit, error) {
	var tried []string
	for _, base := range []string{dir, filepath.Join(dir, name)} {
		for _, f := range []string{"u.data", "ratings.dat", "ratings.csv"} {
			p := filepath.Join(base, f)
			tried = append(tried, p)
			if st, err := os.Stat(p); err == nil && !st.IsDir() {
				r, err := ReadRatings(p, FormatAuto)
				if err != nil {
					return nil, err
				}
				if err := checkOfficial(name, p, len(r)); err != nil {
					return nil, err
				}
				d, err := NewImplicit(r, cfg)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", p, err)
				}
				return d, nil
			}
		}
	}
	return nil, missing(fmt.Errorf("data: no ratings file (tried %v): %w", tried, fs.ErrNotExist), name, dir)
}

// ErrNotOfficial is wrapped by the error of a data set's file that is not
// the official one (LoadMovieLens).
var ErrNotOfficial = errors.New("not the official file")

// officialRatings is the number of ratings of each official MovieLens data
// set, as its README states it (ml-100k: "100,000 ratings (1-5) from 943
// users on 1682 movies"; ml-1m: "1,000,209 anonymous ratings"; ml-20m:
// "20000263 ratings").
var officialRatings = map[string]int{"ml-100k": 100_000, "ml-1m": 1_000_209, "ml-20m": 20_000_263}

// checkOfficial refuses the ratings file path, of n ratings, loaded as the
// official data set name when it is not the official file: its number of
// ratings differs from the published one, or its SHA-256 from the one
// Source.Files lists (ml-100k's u.data). A copy cut short at a line
// boundary parses without an error, and a run would train on it as if it
// were the data set the papers use.
func checkOfficial(name, path string, n int) error {
	want, ok := officialRatings[name]
	if !ok {
		return nil
	}
	// Download does nothing where the data set's folder exists.
	del := "delete it"
	if src, err := LookupSource(name); err == nil && filepath.Base(filepath.Dir(path)) == src.Dir {
		del = "delete the folder " + filepath.Dir(path)
	}
	fix := del + " and download the official archive again"
	if n != want {
		return fmt.Errorf("data: %s holds %d ratings where the official %s file holds %d: %w (cut short, or another file); %s", path, n, name, want, ErrNotOfficial, fix)
	}
	src, err := LookupSource(name)
	if err != nil {
		return nil
	}
	if sum, ok := src.Files[filepath.Base(path)]; ok {
		got, err := fileSHA256(path)
		if err != nil {
			return fmt.Errorf("data: %w", err)
		}
		if !strings.EqualFold(got, sum) {
			return fmt.Errorf("data: %s has SHA-256 %s where the official %s file has %s: %w (changed); %s", path, got, name, sum, ErrNotOfficial, fix)
		}
	}
	return nil
}

// orderByUserTime returns the indices of ratings ordered by user, then time,
// then file order. With user ids that are not too sparse (as in MovieLens) it
// buckets by user first (a counting sort) and sorts each user's few ratings
// by time, which is much faster than one global sort.
func orderByUserTime(ratings []Rating) []int32 {
	order := make([]int32, len(ratings))
	byTime := func(a, b int32) int {
		if c := cmp.Compare(ratings[a].Time, ratings[b].Time); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	}
	minU, maxU := int32(math.MaxInt32), int32(0)
	for i := range ratings {
		minU, maxU = min(minU, ratings[i].User), max(maxU, ratings[i].User)
	}
	span := int64(maxU) - int64(minU) + 1
	if span > 4*int64(len(ratings))+1024 {
		for i := range order {
			order[i] = int32(i)
		}
		slices.SortFunc(order, func(a, b int32) int {
			if c := cmp.Compare(ratings[a].User, ratings[b].User); c != 0 {
				return c
			}
			return byTime(a, b)
		})
		return order
	}
	start := make([]int32, span+1)
	for i := range ratings {
		start[ratings[i].User-minU+1]++
	}
	for u := 1; u < len(start); u++ {
		start[u] += start[u-1]
	}
	next := slices.Clone(start[:span])
	for i := range ratings {
		u := ratings[i].User - minU
		order[next[u]] = int32(i)
		next[u]++
	}
	for u := int64(0); u < span; u++ {
		slices.SortFunc(order[start[u]:start[u+1]], byTime)
	}
	return order
}
