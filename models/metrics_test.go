package models

import (
	"errors"
	"math"
	"testing"
)

func TestRankHit(t *testing.T) {
	// 12 negatives (items 1..12) followed by the positive (item 100).
	neg := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}
	items := append(append([]int(nil), neg...), 100)
	withScores := func(pos float32, negs ...float32) []float32 {
		s := make([]float32, 13)
		for i := range neg {
			s[i] = 0
		}
		copy(s, negs)
		s[12] = pos
		return s
	}
	ones := func(n int, v float32) []float32 {
		s := make([]float32, n)
		for i := range s {
			s[i] = v
		}
		return s
	}
	cases := []struct {
		name     string
		items    []int
		scores   []float32
		wantHit  float64
		wantNDCG float64
	}{
		{"rank1", items, withScores(1), 1, 1},
		// 9 negatives above → rank index 9 (10th place): hit, ln2/ln11.
		{"rank10", items, withScores(0.5, ones(9, 0.9)...), 1, math.Ln2 / math.Log(11)},
		// 10 negatives above → 11th place: miss.
		{"rank11", items, withScores(0.5, ones(10, 0.9)...), 0, 0},
		// Ties count against the positive (it comes last).
		{"ties-all", items, withScores(0.5, ones(12, 0.5)...), 0, 0},
		{"ties-3", items, withScores(0.5, 0.5, 0.5, 0.5), 1, math.Ln2 / math.Log(5)},
		// Duplicated negatives are masked: item 1 ten times above the
		// positive counts once.
		{"dup-negatives", []int{1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 100}, []float32{9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 1}, 1, math.Ln2 / math.Log(3)},
		// A negative equal to the positive item: the positive's position is
		// that first occurrence (scores equal for the same item anyway).
		{"positive-among-negatives", []int{5, 100, 6, 100}, []float32{0.9, 0.2, 0.1, 0.2}, 1, math.Ln2 / math.Log(3)},
		{"single-candidate", []int{3}, []float32{-2}, 1, 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, n, err := RankHit(c.items, c.scores, 10)
			if err != nil {
				t.Fatal(err)
			}
			if h != c.wantHit || math.Abs(n-c.wantNDCG) > 1e-12 {
				t.Fatalf("hit %v ndcg %v, want %v %v", h, n, c.wantHit, c.wantNDCG)
			}
		})
	}
}

func TestRankHitBadInput(t *testing.T) {
	for i, c := range []struct {
		items  []int
		scores []float32
		k      int
	}{
		{nil, nil, 10},
		{[]int{1, 2}, []float32{1}, 10},
		{[]int{1}, []float32{1}, 0},
		{[]int{1, 2}, []float32{float32(math.NaN()), 1}, 10},
	} {
		if _, _, err := RankHit(c.items, c.scores, c.k); !errors.Is(err, ErrBadInput) {
			t.Errorf("case %d: err = %v", i, err)
		}
	}
}

func TestPerplexity(t *testing.T) {
	// Uniform prediction over V tokens has perplexity V.
	if p := Perplexity(10*math.Log(50), 10); math.Abs(p-50) > 1e-9 {
		t.Fatalf("perplexity %v, want 50", p)
	}
}
