package models

import (
	"fmt"
	"math"
)

// Perplexity is exp(lossSum/count), the perplexity of a language model whose
// summed per-token cross-entropy (natural log) over count tokens is lossSum.
func Perplexity(lossSum float64, count int) float64 { return math.Exp(lossSum / float64(count)) }

// RankHit computes the hit (0 or 1) and NDCG contribution of one user for
// the leave-one-out ranking evaluation of the NCF reference code (MLPerf
// style), with cut-off k (10 for HR@10/NDCG@10).
//
// items are the candidate item ids and scores their scores (any monotone
// score: logits or probabilities), the test positive last (the reference
// puts the 100 sampled negatives first). As in the reference: a candidate
// item that repeats an earlier candidate is masked (it can never be ranked);
// the positive's "real" position is the first occurrence of the positive
// item among the candidates; its rank is the number of candidates ranked
// above it, and it is a hit when rank < k, with NDCG = ln 2 / ln(rank + 2).
//
// Ties: the reference ranks with torch.topk, whose order among equal scores
// is unspecified. Here a candidate with a score equal to the positive's
// ranks above it when it comes earlier in the list, i.e. ties count against
// the positive (a pessimistic, deterministic rule). A NaN score is an error.
func RankHit(items []int, scores []float32, k int) (hit, ndcg float64, err error) {
	if len(items) == 0 || len(items) != len(scores) {
		return 0, 0, badInput("RankHit: %d items and %d scores; pass one score per candidate, positive last", len(items), len(scores))
	}
	if k < 1 {
		return 0, 0, badInput("RankHit: cut-off k = %d; use k ≥ 1 (10 for HR@10)", k)
	}
	pos := items[len(items)-1]
	first := -1
	seen := make(map[int]struct{}, len(items))
	masked := make([]bool, len(items))
	for i, it := range items {
		if math.IsNaN(float64(scores[i])) {
			return 0, 0, fmt.Errorf("%w: RankHit: score %d is NaN", ErrBadInput, i)
		}
		if _, dup := seen[it]; dup {
			masked[i] = true
			continue
		}
		seen[it] = struct{}{}
		if it == pos && first < 0 {
			first = i
		}
	}
	ps := scores[first]
	rank := 0
	for i, s := range scores {
		if i == first || masked[i] {
			continue
		}
		if s > ps || (s == ps && i < first) {
			rank++
		}
	}
	if rank < k {
		return 1, math.Ln2 / math.Log(float64(rank)+2), nil
	}
	return 0, 0, nil
}
