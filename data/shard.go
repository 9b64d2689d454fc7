package data

import "fmt"

// Shard describes one rank's share of a data set of N samples for one epoch.
type Shard struct {
	N     int  // samples in the data set
	Rank  int  // this worker's rank, 0 <= Rank < Size
	Size  int  // number of workers
	Train bool // shuffled and remainder-dropped (training) or in file order, complete (evaluation)
	perm  Perm
}

// NewShard returns rank's share of n samples in epoch. For training
// (train = true) the samples are those at positions rank, rank+size, ... of a
// permutation keyed by (seed, epoch), floor(n/size) of them: the last n mod size
// positions of the permutation are dropped, so every rank gets the same count
// and the shares are disjoint. For evaluation (train = false) rank takes
// samples rank, rank+size, ... in order and the shares cover all n samples
// (their lengths differ by at most one).
func NewShard(n, rank, size int, seed uint64, epoch int, train bool) (Shard, error) {
	if size < 1 {
		return Shard{}, fmt.Errorf("data: %d workers: need at least 1", size)
	}
	if rank < 0 || rank >= size {
		return Shard{}, fmt.Errorf("data: rank %d out of range for %d workers (want 0 <= rank < %d)", rank, size, size)
	}
	if n < 0 {
		return Shard{}, fmt.Errorf("data: negative data set size %d", n)
	}
	if epoch < 0 {
		return Shard{}, fmt.Errorf("data: negative epoch %d", epoch)
	}
	s := Shard{N: n, Rank: rank, Size: size, Train: train}
	if train {
		s.perm = NewPerm(n, PermKey(seed, epoch))
	}
	return s, nil
}

// Len returns the number of samples in this rank's share.
func (s Shard) Len() int {
	if s.Train {
		return s.N / s.Size
	}
	if s.Rank >= s.N {
		return 0
	}
	return (s.N - s.Rank + s.Size - 1) / s.Size
}

// At returns the data set index of the i-th sample of the share (0 <= i < Len).
func (s Shard) At(i int) int {
	pos := s.Rank + i*s.Size
	if s.Train {
		return s.perm.At(pos)
	}
	return pos
}
