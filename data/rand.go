package data

import "math/bits"

// mix64 is the SplitMix64 finaliser: a bijective, well-mixing hash of x.
func mix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// key derives a 64-bit key from a seed and a list of integers (domain tags,
// epoch, index); different argument lists give independent-looking keys.
func key(seed uint64, parts ...uint64) uint64 {
	k := mix64(seed ^ 0x5851f42d4c957f2d)
	for _, p := range parts {
		k = mix64(k ^ p)
	}
	return k
}

// Domain tags separate the random streams of different uses of one seed.
const (
	tagPerm uint64 = iota + 1
	tagAugment
	tagNegative
	tagEval
)

// rng is a small SplitMix64 generator; the zero value is usable. It is not
// safe for concurrent use; each goroutine derives its own.
type rng struct{ s uint64 }

func newRNG(k uint64) rng { return rng{s: k} }

func (r *rng) next() uint64 {
	r.s += 0x9e3779b97f4a7c15
	x := r.s
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// intn returns a uniform integer in [0, n) for n > 0 (Lemire's method with
// rejection, so there is no modulo bias).
func (r *rng) intn(n uint64) uint64 {
	hi, lo := bits.Mul64(r.next(), n)
	if lo < n {
		t := -n % n
		for lo < t {
			hi, lo = bits.Mul64(r.next(), n)
		}
	}
	return hi
}

// Perm is a pseudo-random permutation of [0, N) keyed by a 64-bit key. It is
// computed on demand (a four-round, possibly unbalanced Feistel network over
// the smallest power of two >= N, with cycle walking) and needs no memory, so
// shuffling 100 million MovieLens samples costs nothing up front and every
// rank evaluates the same permutation independently.
type Perm struct {
	n      uint64
	lo, hi uint // bit widths of the two Feistel halves (lo + hi bits in all)
	keys   [4]uint64
	ident  bool // n <= 1
}

// NewPerm returns the permutation of [0, n) for the given key. n must be >= 0.
func NewPerm(n int, k uint64) Perm {
	p := Perm{n: uint64(max(n, 0))}
	if n <= 1 {
		p.ident = true
		return p
	}
	b := uint(bits.Len64(uint64(n - 1)))
	if b < 2 {
		b = 2
	}
	p.lo = b / 2
	p.hi = b - p.lo
	for i := range p.keys {
		p.keys[i] = key(k, tagPerm, uint64(i))
	}
	return p
}

// Len returns N.
func (p Perm) Len() int { return int(p.n) }

// At returns the image of i (0 <= i < N).
func (p Perm) At(i int) int {
	if p.ident {
		return i
	}
	x := uint64(i)
	for {
		x = p.feistel(x)
		if x < p.n {
			return int(x)
		}
	}
}

// feistel is a bijection of [0, 2^(lo+hi)). The state is (l, r) with r in
// the low wl bits; a round maps (l, r) to (r, l ^ F(r)), swapping the widths,
// and after an even number of rounds the widths are back where they began.
func (p Perm) feistel(x uint64) uint64 {
	wl, wr := p.hi, p.lo // widths of l and r
	l, r := x>>wr, x&(1<<wr-1)
	for _, k := range p.keys {
		l, r = r, l^(mix64(r^k)&(1<<wl-1))
		wl, wr = wr, wl
	}
	return l<<wr | r
}

// PermKey returns the key of the training permutation of an epoch: the same
// on every rank for the same seed and epoch, different for every epoch.
func PermKey(seed uint64, epoch int) uint64 { return key(seed, tagPerm, uint64(epoch)) }
