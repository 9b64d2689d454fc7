package metrics

import (
	"encoding/json"
	"math"
	"testing"
)

func TestNumJSON(t *testing.T) {
	for _, tc := range []struct {
		in   float64
		json string
	}{
		{1.5, "1.5"}, {0, "0"}, {-2e-300, "-2e-300"}, {math.NaN(), "null"}, {math.Inf(1), "null"}, {math.Inf(-1), "null"},
	} {
		b, err := json.Marshal(Num(tc.in))
		if err != nil || string(b) != tc.json {
			t.Errorf("Marshal(%v) = %s, %v; want %s", tc.in, b, err, tc.json)
		}
		var back Num
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatalf("Unmarshal(%s): %v", b, err)
		}
		want := tc.in
		if math.IsInf(want, 0) {
			want = math.NaN() // null reads back as NaN
		}
		if float64(back) != want && !(math.IsNaN(want) && math.IsNaN(float64(back))) {
			t.Errorf("Unmarshal(%s) = %v, want %v", b, back, want)
		}
	}
	var x Num
	if err := json.Unmarshal([]byte(`"1"`), &x); err == nil {
		t.Error("a string decoded as a number")
	}
}

// TestStepRoundTrip: a step record survives encoding and decoding, NaN as
// null included.
func TestStepRoundTrip(t *testing.T) {
	th := Num(0.25)
	s := Step{Type: TypeStep, Epoch: 2, Step: 7, Loss: 1.25, LR: Num(math.NaN()), Threshold: &th, TCommWall: 0.5,
		LayerK: []int{1, 2}, Ops: map[string]OpCount{"allgather": {1, 2, 3, 4, 0.5}}, Samples: 8, Workers: 2, Wall: 3}
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var back Step
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !math.IsNaN(float64(back.LR)) || back.Loss != 1.25 || *back.Threshold != 0.25 || back.TCommWall != 0.5 ||
		back.Ops["allgather"] != s.Ops["allgather"] || len(back.LayerK) != 2 || back.Wall != 3 {
		t.Fatalf("round trip of %s gave %+v", b, back)
	}
}

func TestThousands(t *testing.T) {
	for _, tc := range []struct {
		n    int
		want string
	}{{0, "0"}, {7, "7"}, {999, "999"}, {1000, "1,000"}, {217630, "217,630"}, {-1234567, "-1,234,567"}, {-12, "-12"}} {
		if got := Thousands(tc.n); got != tc.want {
			t.Errorf("Thousands(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
