package reports

import (
	"math"
	"slices"
	"strconv"
)

// DefaultMaxPoints is the number of points above which a series is
// downsampled.
const DefaultMaxPoints = 5000

// point is one (x, y) sample of a series.
type point struct{ X, Y float64 }

// finite drops the points whose x or y is NaN or infinite.
func finite(pts []point) []point {
	out := make([]point, 0, len(pts))
	for _, p := range pts {
		if isFinite(p.X) && isFinite(p.Y) {
			out = append(out, p)
		}
	}
	return out
}

func isFinite(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }

// downsample returns pts unchanged if it has at most max points; otherwise
// it splits pts (in order) into max/2 buckets of consecutive points, of sizes
// differing by at most one, and keeps from each bucket its point of smallest
// y and its point of largest y (the earliest of equal ones), in their
// original order, so that no spike disappears. The result has at most max
// points and is a subsequence of pts. max < 2 is taken as 2.
func downsample(pts []point, max int) []point {
	if max < 2 {
		max = 2
	}
	n := len(pts)
	if n <= max {
		return pts
	}
	buckets := max / 2
	out := make([]point, 0, 2*buckets)
	for b := 0; b < buckets; b++ {
		lo, hi := b*n/buckets, (b+1)*n/buckets
		imin, imax := lo, lo
		for i := lo + 1; i < hi; i++ {
			if pts[i].Y < pts[imin].Y {
				imin = i
			}
			if pts[i].Y > pts[imax].Y {
				imax = i
			}
		}
		switch {
		case imin == imax:
			out = append(out, pts[imin])
		case imin < imax:
			out = append(out, pts[imin], pts[imax])
		default:
			out = append(out, pts[imax], pts[imin])
		}
	}
	return out
}

// bucketMeans averages vals in at most limit buckets of consecutive entries
// (sizes differing by at most one), ignoring NaN entries (a bucket of NaNs
// gives NaN). It returns the means and each bucket's [lo, hi) range.
func bucketMeans(vals []float64, limit int) (means []float64, ranges [][2]int) {
	n := len(vals)
	buckets := min(n, max(1, limit))
	for b := 0; b < buckets; b++ {
		lo, hi := b*n/buckets, (b+1)*n/buckets
		sum, c := 0.0, 0
		for _, v := range vals[lo:hi] {
			if isFinite(v) {
				sum += v
				c++
			}
		}
		m := math.NaN()
		if c > 0 {
			m = sum / float64(c)
		}
		means = append(means, m)
		ranges = append(ranges, [2]int{lo, hi})
	}
	return means, ranges
}

// bucketQuantiles is bucketMeans with the q-quantile of each bucket's
// finite values (q = 0.5: the median, which one slow iteration in a bucket
// does not move) instead of the mean; the buckets are bucketMeans'.
func bucketQuantiles(vals []float64, max int, q float64) (qs []float64, ranges [][2]int) {
	_, ranges = bucketMeans(vals, max)
	for _, rg := range ranges {
		qs = append(qs, quantile(vals[rg[0]:rg[1]], q))
	}
	return qs, ranges
}

// quantile returns the q-quantile (0 ≤ q ≤ 1) of the finite values of vals,
// interpolating linearly between order statistics (NaN if none).
func quantile(vals []float64, q float64) float64 {
	xs := make([]float64, 0, len(vals))
	for _, v := range vals {
		if isFinite(v) {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return math.NaN()
	}
	slices.Sort(xs)
	pos := q * float64(len(xs)-1)
	i := int(pos)
	if i >= len(xs)-1 {
		return xs[len(xs)-1]
	}
	return xs[i] + (pos-float64(i))*(xs[i+1]-xs[i])
}

// num is a number in a chart's data: it encodes with 6 significant digits
// (the page stays small), NaN and infinities as null.
type num float64

// MarshalJSON implements json.Marshaler.
func (x num) MarshalJSON() ([]byte, error) {
	f := float64(x)
	if !isFinite(f) {
		return []byte("null"), nil
	}
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return strconv.AppendInt(nil, int64(f), 10), nil
	}
	return strconv.AppendFloat(nil, f, 'g', 6, 64), nil
}

// unit is a display unit: shown value = recorded value / div.
type unit struct {
	name string
	div  float64
}

// bytesUnit picks B, kB, MB or GB for values up to max bytes.
func bytesUnit(max float64) unit {
	switch {
	case max >= 1e9:
		return unit{"GB", 1e9}
	case max >= 1e6:
		return unit{"MB", 1e6}
	case max >= 1e3:
		return unit{"kB", 1e3}
	}
	return unit{"B", 1}
}

// timeUnit picks s, min or h for wall times up to max seconds.
func timeUnit(max float64) unit {
	switch {
	case max >= 3*3600:
		return unit{"h", 3600}
	case max >= 180:
		return unit{"min", 60}
	}
	return unit{"s", 1}
}

// durUnit picks µs, ms or s for durations up to max seconds.
func durUnit(max float64) unit {
	switch {
	case max >= 10:
		return unit{"s", 1}
	case max >= 0.01 || max == 0 || !isFinite(max):
		return unit{"ms", 1e-3}
	}
	return unit{"µs", 1e-6}
}
