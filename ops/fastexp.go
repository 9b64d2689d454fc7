package ops

import "math"

// The softmax cross-entropy's exponentials (LogSumExp and its gradient):
// every logit's exp, twice per training step, is most of an LSTM step on
// the CPU at a 28,869-word vocabulary when it goes through math.Exp (about
// 0.69 s of the small LSTM's 1.19 s step, measured). exp32 is a float32
// exponential for x ≤ 0 or a little above: x = n·ln 2 + r with n an
// integer (rounded to even) and |r| ≤ ln 2/2, e^r by its degree-7 Taylor
// polynomial, and 2^n built from n's bits. Its relative error is below
// 1.5e-7 (about one unit in the last place of a float32) for x in
// [−87.3, 88.3]; below −87.3 it returns e^−87.3 (near a float32's smallest
// normal number), above 88.3 e^88.3; NaN stays NaN.
//
// On amd64 with AVX2 eight lanes run at once (fastexp_amd64.s); the Go code
// here does the same float32 operations, unfused and in the same order,
// and adds the lanes' sums in the same order, so both give the same bits
// (TestExp32AVX2MatchesGo).

const (
	expLog2e = 1.44269504088896341
	expLn2Hi = 0.693359375 // 9 significant bits: n·expLn2Hi is exact
	expLn2Lo = -2.12194440e-4
	expLo    = -87.33654 // e^expLo is near the smallest normal float32
	expHi    = 88.37626  // the largest x with n ≤ 127
)

// exp32 is e^x (see above), in float32 operations whose every product is
// rounded before it is added (explicit conversions prevent fusion).
func exp32(x float32) float32 {
	x = min(max(x, expLo), expHi)
	n := float32(math.RoundToEven(float64(float32(x * expLog2e))))
	r := x - float32(n*expLn2Hi)
	r = r - float32(n*expLn2Lo)
	p := float32(1.0 / 5040)
	p = float32(p*r) + 1.0/720
	p = float32(p*r) + 1.0/120
	p = float32(p*r) + 1.0/24
	p = float32(p*r) + 1.0/6
	p = float32(p*r) + 0.5
	p = float32(p*r) + 1
	p = float32(p*r) + 1
	return p * math.Float32frombits(uint32(int32(n)+127)<<23)
}

// expSubSum returns Σᵢ e^(x[i]−sub), the exponentials in float32 and their
// sum in float64: eight running sums over x's first len(x)&^7 elements (sum
// j takes the elements i ≡ j mod 8), added as ((s0+s4)+(s2+s6)) +
// ((s1+s5)+(s3+s7)), then the rest in order.
func expSubSum(x []float32, sub float32) float64 {
	n := len(x) &^ 7
	var s float64
	if useAVX2 && n > 0 {
		s = expSubSum8(x[:n], sub)
	} else {
		var a [8]float64
		for i := 0; i < n; i += 8 {
			for j := range a {
				a[j] += float64(exp32(x[i+j] - sub))
			}
		}
		s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
	}
	for _, v := range x[n:] {
		s += float64(exp32(v - sub))
	}
	return s
}

// expSubScale sets dst[i] = e^(x[i]−sub)·k − spread, the exponential in
// float32 and the rest in float64, rounded once to float32 (dst may be x).
func expSubScale(dst, x []float32, sub float32, k, spread float64) {
	n := len(x) &^ 7
	i := 0
	if useAVX2 && n > 0 {
		expSubScale8(dst[:n], x[:n], sub, k, spread)
		i = n
	}
	for ; i < len(x); i++ {
		dst[i] = float32(float64(float64(exp32(x[i]-sub))*k) - spread)
	}
}
