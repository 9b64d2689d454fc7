package data

import (
	"fmt"
)

// LoaderConfig configures a per-rank batch loader.
type LoaderConfig struct {
	Batch int    // samples per batch on this rank (the local batch size), >= 1
	Rank  int    // this worker's rank, 0 <= Rank < Size
	Size  int    // number of workers, >= 1
	Seed  uint64 // seed of the shuffle, the augmentation and the negative sampling
	// Train selects the training order (a fresh permutation every epoch,
	// remainder dropped, last partial batch dropped, augmentation on) instead
	// of the evaluation order (file order, complete, last batch may be short,
	// no augmentation).
	Train bool
	// NoAugment turns off training augmentation (crops and flips).
	NoAugment bool
	// Workers is the number of goroutines that assemble a batch; 0 means
	// GOMAXPROCS.
	Workers int
	// Prefetch assembles the next batch in the background while the
	// caller uses the one returned (CIFAR): for accelerators, whose steps
	// leave the CPU idle. The batches are the same either way.
	Prefetch bool
}

func (c LoaderConfig) check() error {
	if c.Batch < 1 {
		return fmt.Errorf("data: batch size %d: need at least 1", c.Batch)
	}
	if c.Size < 1 {
		return fmt.Errorf("data: %d workers: need at least 1", c.Size)
	}
	if c.Rank < 0 || c.Rank >= c.Size {
		return fmt.Errorf("data: rank %d out of range for %d workers (want 0 <= rank < %d)", c.Rank, c.Size, c.Size)
	}
	if c.Workers < 0 {
		return fmt.Errorf("data: %d loader goroutines: want 0 (GOMAXPROCS) or more", c.Workers)
	}
	return nil
}

// ImageBatch is a batch of images in NCHW float32 layout with their labels.
// Its slices are owned by the loader and overwritten by the next call.
type ImageBatch struct {
	N      int       // images in this batch (may be < the batch size for the last evaluation batch)
	X      []float32 // N×3×32×32, normalised
	Labels []int32   // N labels (fine labels for CIFAR-100)
	Coarse []int32   // N coarse labels (CIFAR-100 only)
	Index  []int32   // N data set indices the images came from
}

// CIFARLoader serves one rank's batches of a CIFAR split. It is not safe for
// concurrent use. Batch assembly reuses its buffers and allocates nothing
// (with Prefetch: two buffers, one assembled while the other is used).
type CIFARLoader struct {
	ds      *CIFAR
	cfg     LoaderConfig
	epoch   int
	shard   Shard
	lut     [3][256]float32
	bufs    [2]ImageBatch
	last    int // the buffer Batch returned last
	pool    *pool
	augment bool
	// The batch being assembled: its buffer and first shard position (set
	// before each pool.run; one assembly at a time).
	fillBuf *ImageBatch
	cur     int
	// The batch assembled in the background (Prefetch).
	ahead struct {
		pending     bool
		epoch, i, b int
		done        chan struct{}
	}
	prefetched int // batches served from the background (tests)
}

// NewCIFARLoader returns a loader for ds positioned at epoch 0. Call Close when
// done to stop its goroutines.
func NewCIFARLoader(ds *CIFAR, cfg LoaderConfig) (*CIFARLoader, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if ds == nil || ds.Len() == 0 {
		return nil, fmt.Errorf("data: empty CIFAR data set")
	}
	l := &CIFARLoader{ds: ds, cfg: cfg, augment: cfg.Train && !cfg.NoAugment}
	mean, std := ds.Kind.Mean(), ds.Kind.Std()
	for c := 0; c < 3; c++ {
		for v := 0; v < 256; v++ {
			l.lut[c][v] = (float32(v)/255 - mean[c]) / std[c]
		}
	}
	nbuf := 1
	if cfg.Prefetch {
		nbuf = 2
	}
	for b := range nbuf {
		l.bufs[b] = ImageBatch{
			X:      make([]float32, cfg.Batch*CIFARPixels),
			Labels: make([]int32, cfg.Batch),
			Index:  make([]int32, cfg.Batch),
		}
		if ds.Coarse != nil {
			l.bufs[b].Coarse = make([]int32, cfg.Batch)
		}
	}
	l.pool = newPool(cfg.Workers, l.fill)
	if err := l.SetEpoch(0); err != nil {
		return nil, err
	}
	if cfg.Train && l.Len() == 0 {
		l.Close()
		return nil, fmt.Errorf("data: each of %d workers gets %d samples per epoch, fewer than the batch size %d: no full batch to train on; lower the batch size or the number of workers", cfg.Size, l.shard.Len(), cfg.Batch)
	}
	return l, nil
}

// Close stops the loader's goroutines (after a batch being prefetched).
func (l *CIFARLoader) Close() {
	l.settle()
	l.pool.close()
}

// settle waits for the batch being assembled in the background, if any.
func (l *CIFARLoader) settle() {
	if l.ahead.done != nil {
		<-l.ahead.done
		l.ahead.done = nil
	}
}

// SetEpoch selects the epoch whose permutation and augmentation Batch uses.
func (l *CIFARLoader) SetEpoch(epoch int) error {
	l.settle()
	l.ahead.pending = false
	s, err := NewShard(l.ds.Len(), l.cfg.Rank, l.cfg.Size, l.cfg.Seed, epoch, l.cfg.Train)
	if err != nil {
		return err
	}
	l.epoch, l.shard = epoch, s
	return nil
}

// Len returns the number of batches per epoch on this rank (the same on all
// ranks in training).
func (l *CIFARLoader) Len() int {
	n := l.shard.Len()
	if l.cfg.Train {
		return n / l.cfg.Batch
	}
	return (n + l.cfg.Batch - 1) / l.cfg.Batch
}

// Batch assembles batch i (0 <= i < Len) of the current epoch. The returned
// batch is valid until the next call. With Prefetch it is usually ready
// (assembled while the caller used the previous one), and batch i+1 starts
// in the background.
func (l *CIFARLoader) Batch(i int) (*ImageBatch, error) {
	if i < 0 || i >= l.Len() {
		return nil, fmt.Errorf("data: batch %d out of range: epoch %d has %d batches on rank %d", i, l.epoch, l.Len(), l.cfg.Rank)
	}
	l.settle()
	b := 0
	if l.cfg.Prefetch {
		b = 1 - l.last
	}
	if a := l.ahead; a.pending && a.epoch == l.epoch && a.i == i {
		b = a.b
		l.prefetched++
	} else {
		l.assemble(&l.bufs[b], i)
	}
	l.ahead.pending = false
	l.last = b
	if l.cfg.Prefetch && i+1 < l.Len() {
		next := 1 - b
		done := make(chan struct{})
		l.ahead.pending, l.ahead.epoch, l.ahead.i, l.ahead.b, l.ahead.done = true, l.epoch, i+1, next, done
		go func() {
			defer close(done)
			l.assemble(&l.bufs[next], i+1)
		}()
	}
	return &l.bufs[b], nil
}

// assemble fills buf with batch i of the current epoch.
func (l *CIFARLoader) assemble(buf *ImageBatch, i int) {
	l.fillBuf, l.cur = buf, i*l.cfg.Batch
	n := min(l.cfg.Batch, l.shard.Len()-l.cur)
	buf.N = n
	buf.X, buf.Labels, buf.Index = buf.X[:cap(buf.X)], buf.Labels[:cap(buf.Labels)], buf.Index[:cap(buf.Index)]
	if buf.Coarse != nil {
		buf.Coarse = buf.Coarse[:cap(buf.Coarse)]
	}
	l.pool.run(n, 16)
	buf.X, buf.Labels, buf.Index = buf.X[:n*CIFARPixels], buf.Labels[:n], buf.Index[:n]
	if buf.Coarse != nil {
		buf.Coarse = buf.Coarse[:n]
	}
}

// fill assembles images lo..hi-1 of the batch being assembled.
func (l *CIFARLoader) fill(lo, hi int) {
	b := l.fillBuf
	xs := b.X[:cap(b.X)]
	for j := lo; j < hi; j++ {
		idx := l.shard.At(l.cur + j)
		b.Index[:cap(b.Index)][j] = int32(idx)
		b.Labels[:cap(b.Labels)][j] = l.ds.Labels[idx]
		if b.Coarse != nil {
			b.Coarse[:cap(b.Coarse)][j] = l.ds.Coarse[idx]
		}
		src := l.ds.Pixels[idx*CIFARPixels : (idx+1)*CIFARPixels]
		dst := xs[j*CIFARPixels : (j+1)*CIFARPixels]
		if !l.augment {
			for c := 0; c < 3; c++ {
				lut := &l.lut[c]
				s, d := src[c*1024:(c+1)*1024], dst[c*1024:(c+1)*1024]
				for p := range d {
					d[p] = lut[s[p]]
				}
			}
			continue
		}
		dx, dy, flip := CIFARAugment(l.cfg.Seed, l.epoch, idx)
		augmentImage(dst, src, &l.lut, dx-4, dy-4, flip)
	}
}

// CIFARAugment returns the training augmentation of data set image idx in
// epoch: the top-left corner (dx, dy), each in 0..8, of the 32×32 crop of the
// image zero-padded by 4 pixels on every side, and whether the crop is then
// flipped horizontally. It depends only on (seed, epoch, idx).
func CIFARAugment(seed uint64, epoch, idx int) (dx, dy int, flip bool) {
	r := newRNG(key(seed, tagAugment, uint64(epoch), uint64(idx)))
	dx = int(r.intn(9))
	dy = int(r.intn(9))
	flip = r.next()&1 == 1
	return dx, dy, flip
}

// augmentImage writes the normalised crop of src shifted by (ox, oy) (output
// pixel (y, x) reads source pixel (y+oy, x+ox), zero outside), flipped
// horizontally if flip.
func augmentImage(dst []float32, src []byte, lut *[3][256]float32, ox, oy int, flip bool) {
	// Output columns [x0, x1) read source columns inside the image.
	x0, x1 := max(0, -ox), min(CIFARSide, CIFARSide-ox)
	for c := 0; c < 3; c++ {
		lc := &lut[c]
		zero := lc[0]
		plane := src[c*1024 : (c+1)*1024]
		for y := 0; y < CIFARSide; y++ {
			row := dst[c*1024+y*CIFARSide : c*1024+(y+1)*CIFARSide]
			sy := y + oy
			if sy < 0 || sy >= CIFARSide {
				for x := range row {
					row[x] = zero
				}
				continue
			}
			srow := plane[sy*CIFARSide : (sy+1)*CIFARSide]
			if !flip {
				for x := 0; x < x0; x++ {
					row[x] = zero
				}
				for x := x0; x < x1; x++ {
					row[x] = lc[srow[x+ox]]
				}
				for x := x1; x < CIFARSide; x++ {
					row[x] = zero
				}
				continue
			}
			// Flipped: output column x holds crop column 31-x.
			for x := 0; x < CIFARSide; x++ {
				cx := CIFARSide - 1 - x
				if cx < x0 || cx >= x1 {
					row[x] = zero
				} else {
					row[x] = lc[srow[cx+ox]]
				}
			}
		}
	}
}
