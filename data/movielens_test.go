package data

import (
	"cmp"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func randomRatings(r *rand.Rand, n, users, items int, minID int32) []Rating {
	out := make([]Rating, n)
	for i := range out {
		out[i] = Rating{
			User:   minID + int32(r.IntN(users)),
			Item:   minID + int32(r.IntN(items)),
			Rating: float32(1 + r.IntN(5)),
			Time:   int64(r.IntN(50)), // many ties
		}
	}
	return out
}

func formatRatings(rs []Rating, f RatingFormat) string {
	var b strings.Builder
	if f == FormatCSV {
		b.WriteString("userId,movieId,rating,timestamp\r\n")
	}
	for i, r := range rs {
		switch f {
		case FormatUData, FormatNCF:
			fmt.Fprintf(&b, "%d\t%d\t%g\t%d\n", r.User, r.Item, r.Rating, r.Time)
		case FormatDat:
			fmt.Fprintf(&b, "%d::%d::%g::%d\n", r.User, r.Item, r.Rating, r.Time)
		case FormatCSV:
			fmt.Fprintf(&b, "%d,%d,%.1f,%d\r\n", r.User, r.Item, r.Rating, r.Time)
		}
		if i == len(rs)/2 {
			b.WriteString("\n") // a blank line is skipped
		}
	}
	return b.String()
}

func TestParseRatingsFormats(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	for _, f := range []RatingFormat{FormatUData, FormatDat, FormatCSV, FormatNCF} {
		for _, n := range []int{1, 2, 100} {
			minID := int32(1)
			if f == FormatNCF {
				minID = 0
			}
			want := randomRatings(r, n, 10, 20, minID)
			if f == FormatCSV {
				want[0].Rating = 3.5
			}
			got, err := ParseRatings(strings.NewReader(formatRatings(want, f)), "mem", f)
			if err != nil {
				t.Fatalf("%v: %v", f, err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("%v n=%d: got %v want %v", f, n, got, want)
			}
		}
	}
	for name, want := range map[string]RatingFormat{"u.data": FormatUData, "ml-1m/ratings.dat": FormatDat, "ratings.csv": FormatCSV, "ml-1m.train.rating": FormatNCF} {
		if f, err := FormatOf(name); err != nil || f != want {
			t.Errorf("FormatOf(%s) = %v, %v", name, f, err)
		}
	}
	if _, err := FormatOf("ratings.txt"); err == nil {
		t.Error("FormatOf(ratings.txt): no error")
	}
}

func TestParseRatingsBadLines(t *testing.T) {
	cases := []struct {
		f          RatingFormat
		text, want string
	}{
		{FormatUData, "", "no ratings"},
		{FormatUData, "1\t2\t3\t4\n1\t2\t3\n", "line 2: 3 fields, want 4"},
		{FormatUData, "1\t2\t3\t4\t5\n", "line 1: 5 fields"},
		{FormatUData, "x\t2\t3\t4\n", `user id "x" is not an integer`},
		{FormatUData, "0\t2\t3\t4\n", "user id 0 out of range"},
		{FormatDat, "1::99999999999::3::4\n", "item id 99999999999 out of range"},
		{FormatNCF, "-1\t2\t3\t4\n", "user id -1 out of range"},
		{FormatDat, "1::2::7::4\n", `rating "7"`},
		{FormatCSV, "userId,movieId,rating,timestamp\n1,2,NaN,4\n", `line 2: rating "NaN"`},
		{FormatCSV, "userId,movieId,rating\n", "header"},
		{FormatDat, "1::2::3::-5\n", `timestamp "-5"`},
		{FormatDat, "1\t2\t3\t4\n", "1 fields, want 4 (UserID::MovieID::Rating::Timestamp)"},
		{FormatUData, "1\t2\t3\t4\n\x00\x00\n", "line 2 contains a NUL byte"},
	}
	for _, c := range cases {
		_, err := ParseRatings(strings.NewReader(c.text), "bad.file", c.f)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "bad.file") {
			t.Errorf("%v %q: %v, want an error naming the file and %q", c.f, c.text, err, c.want)
		}
	}
	if _, err := ParseRatings(strings.NewReader("1\t1\t1\t1\n"), "x", FormatAuto); err == nil {
		t.Error("FormatAuto in ParseRatings: no error")
	}
}

// refImplicit is the obvious leave-one-out split with maps.
type refSplit struct {
	users, items []int32 // original ids, ascending
	train        [][]int32
	test         []int32
}

func refImplicit(rs []Rating, minR int) refSplit {
	type ev struct {
		item int32
		time int64
		pos  int
	}
	byUser := map[int32][]ev{}
	for i, r := range rs {
		byUser[r.User] = append(byUser[r.User], ev{r.Item, r.Time, i})
	}
	var out refSplit
	lists := map[int32][]int32{}
	for u, evs := range byUser {
		slices.SortFunc(evs, func(a, b ev) int {
			if c := cmp.Compare(a.time, b.time); c != 0 {
				return c
			}
			return cmp.Compare(a.pos, b.pos)
		})
		var items []int32
		for _, e := range evs {
			if !slices.Contains(items, e.item) {
				items = append(items, e.item)
			}
		}
		if len(items) >= max(minR, 2) {
			lists[u] = items
			out.users = append(out.users, u)
		}
	}
	slices.Sort(out.users)
	itemIdx := map[int32]int32{}
	for _, items := range lists {
		for _, it := range items {
			itemIdx[it] = 0
		}
	}
	for it := range itemIdx {
		out.items = append(out.items, it)
	}
	slices.Sort(out.items)
	for i, it := range out.items {
		itemIdx[it] = int32(i)
	}
	for _, u := range out.users {
		items := lists[u]
		var tr []int32
		for _, it := range items[:len(items)-1] {
			tr = append(tr, itemIdx[it])
		}
		out.train = append(out.train, tr)
		out.test = append(out.test, itemIdx[items[len(items)-1]])
	}
	return out
}

func TestImplicitMatchesReference(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	for _, c := range []struct{ n, users, items, minR, neg int }{
		{2, 1, 5, 0, 1}, {10, 3, 30, 0, 3}, {300, 20, 60, 0, 10}, {300, 20, 60, 16, 5}, {2000, 50, 200, 0, 0},
	} {
		rs := randomRatings(r, c.n, c.users, c.items, 1)
		if c.n == 2 { // the smallest valid set: two users, three items, one negative each
			rs = []Rating{{User: 1, Item: 1, Time: 5}, {User: 2, Item: 3, Time: 1}, {User: 1, Item: 2, Time: 1}, {User: 2, Item: 2, Time: 9}}
		}
		ref := refImplicit(rs, c.minR)
		d, err := NewImplicit(rs, ImplicitConfig{MinRatings: c.minR, EvalNegatives: c.neg, Seed: 5})
		if len(ref.users) == 0 {
			if err == nil {
				t.Fatalf("%+v: no users left but no error", c)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		if !slices.Equal(d.UserIDs, ref.users) || !slices.Equal(d.ItemIDs, ref.items) || d.Users != len(ref.users) || d.Items != len(ref.items) {
			t.Fatalf("%+v: ids differ", c)
		}
		p := 0
		for u := range ref.users {
			for _, it := range ref.train[u] {
				if d.TrainUser[p] != int32(u) || d.TrainItem[p] != it {
					t.Fatalf("%+v: positive %d = (%d,%d), want (%d,%d)", c, p, d.TrainUser[p], d.TrainItem[p], u, it)
				}
				p++
			}
			if d.TestItem[u] != ref.test[u] {
				t.Fatalf("user %d test item %d, want %d", u, d.TestItem[u], ref.test[u])
			}
			rated := append(slices.Clone(ref.train[u]), ref.test[u])
			slices.Sort(rated)
			if !slices.Equal(d.Rated(u), rated) {
				t.Fatalf("user %d rated %v, want %v", u, d.Rated(u), rated)
			}
			// k-th unrated item against enumeration.
			k := int32(0)
			for it := int32(0); it < int32(d.Items); it++ {
				if !slices.Contains(rated, it) {
					if got := d.unrated(u, k); got != it {
						t.Fatalf("unrated(%d, %d) = %d, want %d", u, k, got, it)
					}
					k++
				}
			}
			wantNeg := c.neg
			if wantNeg == 0 {
				wantNeg = 99
			}
			cand := d.Candidates(u)
			if len(cand) != 1+wantNeg || cand[0] != ref.test[u] {
				t.Fatalf("candidates %v", cand)
			}
			negs := slices.Clone(cand[1:])
			slices.Sort(negs)
			if len(slices.Compact(negs)) != wantNeg {
				t.Fatalf("user %d: repeated evaluation negatives %v", u, cand[1:])
			}
			for _, it := range negs {
				if it < 0 || int(it) >= d.Items || slices.Contains(rated, it) {
					t.Fatalf("user %d: evaluation negative %d is rated or out of range", u, it)
				}
			}
		}
		if p != len(d.TrainUser) {
			t.Fatalf("%d positives, want %d", len(d.TrainUser), p)
		}
		d2, _ := NewImplicit(rs, ImplicitConfig{MinRatings: c.minR, EvalNegatives: c.neg, Seed: 5})
		if !slices.Equal(d.Eval, d2.Eval) {
			t.Fatal("evaluation candidates differ for the same seed")
		}
	}
}

func TestImplicitEvalNegativesUniform(t *testing.T) {
	// User 1 rated items 1..10 of 50; 20 negatives are drawn from the 40
	// others, so each of them is drawn with probability 1/2.
	var rs []Rating
	for i := 1; i <= 50; i++ {
		u := int32(2 + (i-11)/20)
		if i <= 10 {
			u = 1
		}
		rs = append(rs, Rating{User: u, Item: int32(i), Time: int64(i)})
	}
	counts := make([]int, 50)
	const seeds = 2000
	for s := uint64(0); s < seeds; s++ {
		d, err := NewImplicit(rs, ImplicitConfig{EvalNegatives: 20, Seed: s})
		if err != nil {
			t.Fatal(err)
		}
		if d.Items != 50 || d.UserIDs[0] != 1 {
			t.Fatalf("%d items, first user %d", d.Items, d.UserIDs[0])
		}
		for _, it := range d.Candidates(0)[1:] {
			counts[it]++
		}
	}
	// Binomial(2000, 1/2): sd 22; allow 5 sd.
	for it, c := range counts {
		if it < 10 && c != 0 {
			t.Errorf("rated item %d drawn %d times", it, c)
		}
		if it >= 10 && math.Abs(float64(c)-1000) > 112 {
			t.Errorf("item %d drawn %d times of %d, want about 1000", it, c, seeds)
		}
	}
}

func TestImplicitErrors(t *testing.T) {
	if _, err := NewImplicit(nil, ImplicitConfig{}); err == nil {
		t.Error("no ratings: no error")
	}
	if _, err := NewImplicit([]Rating{{User: 1, Item: 1}, {User: 1, Item: 1, Time: 2}}, ImplicitConfig{}); err == nil || !strings.Contains(err.Error(), "truncated") || !strings.Contains(err.Error(), "-download") {
		t.Errorf("one distinct item: %v", err)
	}
	rs := []Rating{{User: 1, Item: 1}, {User: 1, Item: 2}, {User: 2, Item: 3}, {User: 2, Item: 4}}
	if _, err := NewImplicit(rs, ImplicitConfig{EvalNegatives: 3}); err == nil || !strings.Contains(err.Error(), "lower EvalNegatives") {
		t.Errorf("too few unrated items: %v", err)
	}
	if _, err := NewImplicit(rs, ImplicitConfig{EvalNegatives: -1}); err == nil {
		t.Error("negative EvalNegatives: no error")
	}
}

func TestAtoi(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
		ok   bool
	}{{"0", 0, true}, {"42", 42, true}, {"-7", -7, true}, {"+3", 3, true}, {"", 0, false}, {"-", 0, false}, {"1.5", 0, false},
		{"123456789012345678", 123456789012345678, true}, {"1234567890123456789", 0, false}, {" 1", 0, false}} {
		v, ok := atoi([]byte(c.in))
		if v != c.want || ok != c.ok {
			t.Errorf("atoi(%q) = %d, %v; want %d, %v", c.in, v, ok, c.want, c.ok)
		}
	}
}

func TestOrderByUserTimeBothPaths(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	for _, spread := range []int32{1, 10000000} { // dense ids: counting sort; sparse: global sort
		rs := randomRatings(r, 500, 30, 40, 1)
		for i := range rs {
			rs[i].User *= spread
		}
		got := orderByUserTime(rs)
		want := make([]int32, len(rs))
		for i := range want {
			want[i] = int32(i)
		}
		slices.SortStableFunc(want, func(a, b int32) int {
			if c := cmp.Compare(rs[a].User, rs[b].User); c != 0 {
				return c
			}
			return cmp.Compare(rs[a].Time, rs[b].Time)
		})
		if !slices.Equal(got, want) {
			t.Fatalf("spread %d: order differs from a stable sort", spread)
		}
	}
}
