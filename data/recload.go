package data

import (
	"fmt"
	"slices"
)

// RecBatch is a batch of (user, item, label) training samples. Its slices are
// owned by the loader and overwritten by the next call.
type RecBatch struct {
	N      int
	Users  []int32
	Items  []int32
	Labels []float32 // 1 for a positive, 0 for a sampled negative
}

// RecLoader serves one rank's training batches of an implicit-feedback data
// set: each epoch has P·(1+Negatives) samples, where P is the number of
// training positives; sample j is positive j/(1+Negatives) when
// j mod (1+Negatives) == 0, and otherwise a negative for the same user, drawn
// uniformly from the items the user has not rated (training or test) by a
// generator keyed by (seed, epoch, j). The samples are then shuffled by the
// epoch's permutation and sharded like every training loader (see Shard), so
// every rank sees a shuffled mix of positives and negatives.
//
// Deviation from the NCF reference code, on purpose: there, negatives are drawn
// from all items (a "negative" may be a positive) and each worker takes a
// contiguous slice of the unshuffled [positives; negatives] array, so with 16
// workers most workers see only negatives.
type RecLoader struct {
	ds    *Implicit
	cfg   LoaderConfig
	neg   int
	epoch int
	negK  uint64 // negKey(epoch)
	shard Shard
	batch RecBatch
	keys  []uint64 // per batch: sample index << 24 | position, for cache-friendly assembly
	pool  *pool
	cur   int
}

// NewRecLoader returns a loader with negatives sampled negatives per positive
// (4 in NCF), positioned at epoch 0. Call Close when done.
func NewRecLoader(ds *Implicit, cfg LoaderConfig, negatives int) (*RecLoader, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if negatives < 0 {
		return nil, fmt.Errorf("data: %d negatives per positive: want 0 or more", negatives)
	}
	if ds == nil || len(ds.TrainUser) == 0 {
		return nil, fmt.Errorf("data: implicit data set has no training positives")
	}
	l := &RecLoader{ds: ds, cfg: cfg, neg: negatives}
	if err := l.SetEpoch(0); err != nil {
		return nil, err
	}
	if cfg.Train && l.Len() == 0 {
		return nil, fmt.Errorf("data: each of %d workers gets %d samples per epoch, fewer than the batch size %d: no full batch to train on; lower the batch size or the number of workers", cfg.Size, l.shard.Len(), cfg.Batch)
	}
	// No batch holds more than the share: checked and sized before
	// allocating.
	n := min(cfg.Batch, l.shard.Len())
	l.batch = RecBatch{Users: make([]int32, n), Items: make([]int32, n), Labels: make([]float32, n)}
	if n <= 1<<24 && l.Samples() < 1<<40 {
		l.keys = make([]uint64, n)
	}
	l.pool = newPool(cfg.Workers, l.fill)
	return l, nil
}

// Close stops the loader's goroutines.
func (l *RecLoader) Close() { l.pool.close() }

// Samples returns the number of samples per epoch over all ranks.
func (l *RecLoader) Samples() int { return len(l.ds.TrainUser) * (1 + l.neg) }

// SetEpoch selects the epoch whose permutation and negatives Batch uses.
func (l *RecLoader) SetEpoch(epoch int) error {
	s, err := NewShard(l.Samples(), l.cfg.Rank, l.cfg.Size, l.cfg.Seed, epoch, l.cfg.Train)
	if err != nil {
		return err
	}
	l.epoch, l.shard, l.negK = epoch, s, l.negKey(epoch)
	return nil
}

// Len returns the number of batches per epoch on this rank; in training the
// last partial batch is dropped, as in NCF.
func (l *RecLoader) Len() int {
	n := l.shard.Len()
	if l.cfg.Train {
		return n / l.cfg.Batch
	}
	return (n + l.cfg.Batch - 1) / l.cfg.Batch
}

// Sample returns training sample j (0 <= j < Samples()) of epoch.
func (l *RecLoader) Sample(epoch, j int) (user, item int32, label float32) {
	return l.sample(l.negKey(epoch), j)
}

// negKey is the key of an epoch's negative sampling.
func (l *RecLoader) negKey(epoch int) uint64 { return key(l.cfg.Seed, tagNegative, uint64(epoch)) }

func (l *RecLoader) sample(negK uint64, j int) (user, item int32, label float32) {
	p := j / (1 + l.neg)
	u := l.ds.TrainUser[p]
	if j%(1+l.neg) == 0 {
		return u, l.ds.TrainItem[p], 1
	}
	free := l.ds.Items - int(l.ds.ratedOff[u+1]-l.ds.ratedOff[u])
	r := newRNG(mix64(negK ^ uint64(j)))
	return u, l.ds.unrated(int(u), int32(r.intn(uint64(free)))), 0
}

// Batch assembles batch i (0 <= i < Len) of the current epoch; it allocates
// nothing. The returned batch is valid until the next call.
func (l *RecLoader) Batch(i int) (*RecBatch, error) {
	if i < 0 || i >= l.Len() {
		return nil, fmt.Errorf("data: batch %d out of range: epoch %d has %d batches on rank %d", i, l.epoch, l.Len(), l.cfg.Rank)
	}
	l.cur = i * l.cfg.Batch
	n := min(l.cfg.Batch, l.shard.Len()-l.cur)
	l.pool.run(n, 4096)
	b := &l.batch
	b.N = n
	b.Users, b.Items, b.Labels = b.Users[:n], b.Items[:n], b.Labels[:n]
	return b, nil
}

// fill assembles samples lo..hi-1 of the current batch. The samples are
// computed in order of their sample index, so that the training positives,
// and each user's rated items, are read in memory order with reuse instead of
// at random; the results go to their shuffled positions.
func (l *RecLoader) fill(lo, hi int) {
	b := &l.batch
	us, is, ls := b.Users[:cap(b.Users)], b.Items[:cap(b.Items)], b.Labels[:cap(b.Labels)]
	if l.keys == nil {
		for k := lo; k < hi; k++ {
			us[k], is[k], ls[k] = l.sample(l.negK, l.shard.At(l.cur+k))
		}
		return
	}
	keys := l.keys[lo:hi]
	for k := range keys {
		keys[k] = uint64(l.shard.At(l.cur+lo+k))<<24 | uint64(lo+k)
	}
	slices.Sort(keys)
	for _, key := range keys {
		k := int(key & (1<<24 - 1))
		us[k], is[k], ls[k] = l.sample(l.negK, int(key>>24))
	}
}
