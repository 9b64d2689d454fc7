package device

import "math"

// ToFloat16 rounds f to the nearest IEEE 754 half-precision value, ties to
// even (as a GPU's __float2half_rn and PyTorch's .half() do), and returns
// its bits: magnitudes of 65520 and above become ±Inf, those of 2⁻²⁵ and
// below ±0, NaN stays NaN (quiet, its sign kept).
func ToFloat16(f float32) uint16 { return float16Of(float64(f)) }

// float16Of rounds x to half precision, ties to even, in one rounding.
func float16Of(x float64) uint16 {
	u := math.Float64bits(x)
	sign := uint16(u>>48) & 0x8000
	exp := int(u>>52) & 0x7ff
	man := u & (1<<52 - 1)
	switch {
	case exp == 0x7ff: // Inf or NaN
		if man != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp == 0: // zero or float64 subnormal: far below half's range
		return sign
	}
	e := exp - 1023 + 15 // half's biased exponent
	m := man | 1<<52     // 53 bits with the implicit one
	shift := 42          // normal: keep 11 bits
	if e < 1 {
		shift = 42 + 1 - e // subnormal: keep fewer
		if shift > 53 {
			return sign
		}
		e = 1
	}
	h := m >> shift
	rem := m & (1<<shift - 1)
	halfway := uint64(1) << (shift - 1)
	if rem > halfway || (rem == halfway && h&1 == 1) {
		h++
	}
	// h is the significand with its implicit bit at bit 10 when normal (a
	// carry into bit 11 moves to the next binade: the exponent field is
	// added, not or-ed) and without it when subnormal (e is then 1, and
	// (e−1)<<10 + h is h, a carry into bit 10 making the smallest normal).
	bits := uint64(e-1)<<10 + h
	if bits >= 0x7c00 {
		return sign | 0x7c00
	}
	return sign | uint16(bits)
}

// halfValues are the float32 values of the 65536 half-precision bit
// patterns (FromFloat16's table, 256 KiB).
var halfValues = func() *[1 << 16]float32 {
	var t [1 << 16]float32
	for h := range t {
		t[h] = fromFloat16(uint16(h))
	}
	return &t
}()

// FromFloat16 is the float32 value of the half-precision bits h (exact).
func FromFloat16(h uint16) float32 { return halfValues[h] }

// fromFloat16 computes FromFloat16's table entries.
func fromFloat16(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	man := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | man<<13)
	case exp == 0:
		// ±0 or subnormal: man·2⁻²⁴.
		v := float32(man) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | man<<13)
}

// AddFloat16 is the half-precision sum of a and b, rounded once to the
// nearest, ties to even (the sum is exact in float64 before the rounding).
func AddFloat16(a, b uint16) uint16 {
	return float16Of(float64(halfValues[a]) + float64(halfValues[b]))
}
