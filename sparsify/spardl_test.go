package sparsify

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/comm/local"
)

// spardlRefH is the B-SAG final-block budget state of one in-team rank.
type spardlRefH struct {
	h, step int
	inertia bool
}

// spardlRefSetup returns Q, C, k and the initial h state of every in-team
// rank, from the spec.
func spardlRefSetup(P, G, N int, density float64, rsag bool) (Q, C, k int, hs []spardlRefH) {
	Q = P / G
	C = (N + Q - 1) / Q
	k = min(max(int(float64(C)*density), 1), C)
	hs = make([]spardlRefH, Q)
	for r := range hs {
		hs[r] = spardlRefH{h: k}
		if G > 1 && !rsag {
			ck := float64(C) * density
			h := int(ck / float64(G))
			hs[r] = spardlRefH{h: min(max(h, 1), C), step: int((ck - float64(h)) / 100)}
		}
	}
	return Q, C, k, hs
}

// spardlRefList is a sparse block: ascending indices and their values.
type spardlRefList struct {
	idx  []int32
	vals []float32
}

// spardlRefTake selects the top-k of x (refTopK), returns them and zeroes
// them in x.
func spardlRefTake(x []float32, k int) spardlRefList {
	var l spardlRefList
	for _, j := range refTopK(x, k) {
		l.idx = append(l.idx, j)
		l.vals = append(l.vals, x[j])
		x[j] = 0
	}
	return l
}

// spardlRefTrim keeps the top-k entries of l (by refTopK on its values) and
// reports the others to drop.
func spardlRefTrim(l spardlRefList, k int, drop func(j int32, v float32)) spardlRefList {
	if len(l.idx) <= k {
		return l
	}
	keep := map[int32]bool{}
	for _, p := range refTopK(l.vals, k) {
		keep[p] = true
	}
	var out spardlRefList
	for p := range l.idx {
		if keep[int32(p)] {
			out.idx = append(out.idx, l.idx[p])
			out.vals = append(out.vals, l.vals[p])
		} else if drop != nil {
			drop(l.idx[p], l.vals[p])
		}
	}
	return out
}

// spardlRefResult is the outcome of one iteration on all workers.
type spardlRefResult struct {
	out      []float32
	res      [][]float32
	final    []spardlRefList // per block
	distinct int
}

// spardlRef simulates SparDL over all P workers' accs in one process, from
// the spec: Spar-Reduce-Scatter round by round (all workers select, then all
// messages are delivered), the SAG across teams, and the global residual
// collection. The Bruck all-gather only copies the final blocks, so it is
// implicit here. hs is updated for the next iteration.
func spardlRef(P, G int, rsag bool, N int, density float64, accs [][]float32, hs []spardlRefH) spardlRefResult {
	Q, C, k, _ := spardlRefSetup(P, G, N, density, rsag)
	A := make([][]float32, P)
	for w := range P {
		A[w] = make([]float32, Q*C)
		copy(A[w], accs[w])
	}
	block := func(w, b int) []float32 { return A[w][b*C : (b+1)*C] }
	m := 0
	for 1<<m < Q {
		m++
	}
	for i := 0; i < m; i++ {
		gap := 1 << (m - 1 - i)
		size := gap
		if i == 0 {
			size = Q - 1<<(m-1)
		}
		for j := 0; j < size; j++ {
			msgs := make([]spardlRefList, P)
			for w := range P {
				msgs[w] = spardlRefTake(block(w, (w%Q+gap+j)%Q), k)
			}
			for w := range P {
				team, r := w/Q, w%Q
				dst := team*Q + (r+gap)%Q
				b := (dst%Q + j) % Q // the block dst expects: its (r'+j)
				if b != (r+gap+j)%Q {
					panic("schedule mismatch")
				}
				for t, x := range msgs[w].idx {
					block(dst, b)[x] += msgs[w].vals[t]
				}
			}
		}
	}
	lists := make([]spardlRefList, P)
	for w := range P {
		lists[w] = spardlRefTake(block(w, w%Q), hs[w%Q].h)
	}
	endp := make([][]float32, P)
	for w := range endp {
		endp[w] = make([]float32, C)
	}
	if G > 1 && rsag {
		for gap := 1; gap < G; gap *= 2 {
			next := make([]spardlRefList, P)
			for w := range P {
				team, r := w/Q, w%Q
				peer := (team^gap)*Q + r
				sum := map[int32]float32{}
				for _, l := range []spardlRefList{lists[w], lists[peer]} {
					for t, x := range l.idx {
						sum[x] += l.vals[t]
					}
				}
				var merged spardlRefList
				for x := range sum {
					merged.idx = append(merged.idx, x)
				}
				slices.Sort(merged.idx)
				for _, x := range merged.idx {
					merged.vals = append(merged.vals, sum[x])
				}
				next[w] = spardlRefTrim(merged, k, func(j int32, v float32) { endp[w][j] += v / float32(2*gap) })
			}
			lists = next
		}
	} else if G > 1 {
		for r := range Q {
			sum := make([]float32, C)
			seen := make([]bool, C)
			var u []int32
			for t := range G {
				l := lists[t*Q+r]
				for p, x := range l.idx {
					if !seen[x] {
						seen[x] = true
						u = append(u, x)
					}
					sum[x] += l.vals[p]
				}
			}
			slices.Sort(u)
			merged := spardlRefList{idx: u}
			for _, x := range u {
				merged.vals = append(merged.vals, sum[x])
			}
			U := len(u)
			merged = spardlRefTrim(merged, k, nil)
			for t := range G {
				lists[t*Q+r] = merged
			}
			// The reference's h rule.
			s := &hs[r]
			if (U > k) != (s.step > 0) {
				if s.inertia {
					s.step *= 2
					s.inertia = false
				} else {
					s.inertia = true
				}
			} else {
				if abs := max(s.step, -s.step); abs > 1 {
					s.step = int(-0.5 * float64(s.step))
				} else {
					s.step = -s.step
				}
				s.inertia = false
			}
			s.h = min(max(max(s.h+s.step, k/G), 1), C)
		}
	}
	res := spardlRefResult{out: make([]float32, N), res: make([][]float32, P), final: lists[:Q]}
	for w := range P {
		res.res[w] = slices.Clone(accs[w])
	}
	for j := range Q {
		for t, x := range lists[j].idx {
			pos := j*C + int(x)
			if pos >= N {
				continue
			}
			res.distinct++

			res.out[pos] = lists[j].vals[t] / float32(P)
			for w := range P {
				v := A[w][pos]
				if rsag && w%Q == j {
					v += endp[w][x]
				}
				res.res[w][pos] = v
			}
		}
	}
	return res
}

// spardlSpy forwards to a real communicator and records the length of every
// point-to-point index message per phase.
type spardlSpy struct {
	comm.Communicator
	mu       sync.Mutex
	maxPairs map[int]int // phase tag -> largest index message
	msgs     map[int]int // phase tag -> number of index messages
}

func (s *spardlSpy) SendRecv(ctx context.Context, send comm.Buffer, dst int, recv comm.Buffer, src, tag int) (int, error) {
	if tag%16 == 1 { // index message of a phase
		s.mu.Lock()
		s.maxPairs[tag-1] = max(s.maxPairs[tag-1], send.Len())
		s.msgs[tag-1]++
		s.mu.Unlock()
	}
	return s.Communicator.SendRecv(ctx, send, dst, recv, src, tag)
}

// spardlCase is one SparDL configuration.
type spardlCase struct {
	P, G    int
	rsag    bool
	N       int
	density float64
	iters   int
	gen     harnessGen
	inPlace bool
}

func (c spardlCase) String() string {
	sag := "bsag"
	if c.rsag {
		sag = "rsag"
	}
	return fmt.Sprintf("P=%d/G=%d/%s/N=%d/rho=%g", c.P, c.G, sag, c.N, c.density)
}

// spardlCheck runs c on in-process workers and compares every iteration with
// spardlRef, the budgets, the stats and conservation.
func spardlCheck(t *testing.T, c spardlCase, seed uint64) {
	t.Helper()
	spies := make([]*spardlSpy, c.P)
	cfg := harnessConfig{
		Method: "spardl", Workers: c.P, N: c.N, Density: c.density, Iters: c.iters, Seed: seed,
		Feedback: true, InPlace: c.inPlace, Gen: c.gen,
		Options: func(o *Options) {
			o.Params = Values{"teams": c.G}
			if c.rsag {
				o.Params["sag"] = "rsag"
			}
			s := &spardlSpy{Communicator: o.Comm, maxPairs: map[int]int{}, msgs: map[int]int{}}
			spies[o.Comm.Rank()] = s
			o.Comm = s
		},
	}
	res := mustRunHarness(t, cfg)
	Q, C, k, hs := spardlRefSetup(c.P, c.G, c.N, c.density, c.rsag)
	for it := range res.Acc {
		hBefore := slices.Clone(hs)
		ref := spardlRef(c.P, c.G, c.rsag, c.N, c.density, res.Acc[it], hs)
		nonzero := 0
		for _, v := range ref.out {
			if v != 0 {
				nonzero++
			}
		}
		maxFinal := Q * k
		if c.G == 1 {
			maxFinal = Q * hBefore[0].h
		}
		if nonzero > maxFinal || ref.distinct > maxFinal {
			t.Fatalf("%v it %d: %d nonzeros / %d final positions, budget Q·h = %d", c, it, nonzero, ref.distinct, maxFinal)
		}
		for w := range c.P {
			what := fmt.Sprintf("%v it=%d rank %d", c, it, w)
			checkClose(t, what+" out", res.Out[it][w], ref.out, nil)
			checkClose(t, what+" residual", res.Residual[it][w], ref.res[w], nil)
			st := res.Stats[it][w]
			if want := float64(ref.distinct) / float64(c.N); st.ActualDensity != want {
				t.Fatalf("%s: ActualDensity %v, want %v", what, st.ActualDensity, want)
			}
			if st.Selected != len(ref.final[w%Q].idx) {
				t.Fatalf("%s: Selected %d, want %d", what, st.Selected, len(ref.final[w%Q].idx))
			}
			for v := range c.P {
				if st.SelectedPerWorker[v] != len(ref.final[v%Q].idx) {
					t.Fatalf("%s: SelectedPerWorker %v", what, st.SelectedPerWorker)
				}
			}
			if !math.IsNaN(st.Threshold) {
				t.Fatalf("%s: Threshold %v, want NaN", what, st.Threshold)
			}
			if want := norm2(ref.res[w]); math.Abs(st.ErrorNorm-want) > 1e-9*(1+want) {
				t.Fatalf("%s: ErrorNorm %v, want %v", what, st.ErrorNorm, want)
			}
			if c.P > 1 && (st.BytesSent <= 0 || st.BytesRecv <= 0) {
				t.Fatalf("%s: no bytes counted (%d/%d)", what, st.BytesSent, st.BytesRecv)
			}
		}
	}
	// Budgets of the messages: every Spar-Reduce-Scatter, Bruck and R-SAG
	// message carries at most k pairs; B-SAG ones at most C.
	for w, s := range spies {
		if s.maxPairs[spardlTagSRS] > k || s.maxPairs[spardlTagBruck] > k {
			t.Fatalf("%v rank %d: a message carried %d / %d pairs, budget k = %d", c, w, s.maxPairs[spardlTagSRS], s.maxPairs[spardlTagBruck], k)
		}
		if c.rsag && s.maxPairs[spardlTagSAG] > k || s.maxPairs[spardlTagSAG] > C {
			t.Fatalf("%v rank %d: a SAG message carried %d pairs (k = %d, C = %d)", c, w, s.maxPairs[spardlTagSAG], k, C)
		}
		// Q−1 reduce-scatter and Q−1 all-gather transfers per iteration.
		if s.msgs[spardlTagSRS] != c.iters*(Q-1) || s.msgs[spardlTagBruck] != c.iters*(Q-1) {
			t.Fatalf("%v rank %d: %d reduce-scatter and %d all-gather messages over %d iterations, want %d each", c, w, s.msgs[spardlTagSRS], s.msgs[spardlTagBruck], c.iters, c.iters*(Q-1))
		}
	}
	checkOutputsAgree(t, res)
	checkConservation(t, res)
}

func TestSparDLMatchesReference(t *testing.T) {
	for ci, c := range standardCases() {
		sc := spardlCase{P: c.Workers, G: 1, N: c.N, density: c.Density, iters: 2, inPlace: ci%2 == 1}
		if ci%3 == 2 {
			sc.gen = genSmallInts
		}
		t.Run(sc.String(), func(t *testing.T) { spardlCheck(t, sc, uint64(ci)) })
	}
}

func TestSparDLTeams(t *testing.T) {
	var cases []spardlCase
	for _, N := range []int{1, 5, 97, 1001} {
		for _, d := range []float64{1e-9, 0.05, 0.3} {
			for _, pg := range [][2]int{{4, 2}, {6, 2}, {6, 3}, {6, 6}, {8, 4}, {16, 4}, {8, 8}, {16, 8}} {
				for _, rsag := range []bool{false, true} {
					if rsag && pg[1]&(pg[1]-1) != 0 {
						continue
					}
					cases = append(cases, spardlCase{P: pg[0], G: pg[1], rsag: rsag, N: N, density: d, iters: 6, inPlace: N%2 == 0})
				}
			}
		}
	}
	if testing.Short() {
		cases = cases[:len(cases)/3]
	}
	for ci, c := range cases {
		t.Run(c.String(), func(t *testing.T) { spardlCheck(t, c, uint64(100+ci)) })
	}
}

// TestSparDLHAdapts makes sure the B-SAG budget h actually moves in the
// tested configurations (so the reference comparison covers the rule).
func TestSparDLHAdapts(t *testing.T) {
	const P, G, N, density = 6, 3, 3000, 0.3
	_, _, _, hs := spardlRefSetup(P, G, N, density, false)
	first := hs[0].h
	rng := rand.New(rand.NewPCG(1, 2))
	changed := false
	for range 6 {
		accs := make([][]float32, P)
		for w := range accs {
			accs[w] = make([]float32, N)
			genNormal(rng, accs[w])
		}
		spardlRef(P, G, false, N, density, accs, hs)
		changed = changed || hs[0].h != first
	}
	if !changed {
		t.Fatalf("h stayed at %d for 6 iterations", first)
	}
	spardlCheck(t, spardlCase{P: P, G: G, N: N, density: density, iters: 6}, 9)
}

// TestSparDLSchedule simulates the Spar-Reduce-Scatter schedule for
// Q = 2…33 with contributor counts: every message goes to a worker that
// expects it, no worker receives a block it already sent, each worker sends
// every block but its own exactly once, and each worker ends with its own
// block holding every worker's contribution exactly once.
func TestSparDLSchedule(t *testing.T) {
	for Q := 1; Q <= 33; Q++ {
		scheds := make([][]spardlStep, Q)
		for r := range Q {
			scheds[r] = spardlSchedule(Q, r)
			if len(scheds[r]) != Q-1 {
				t.Fatalf("Q=%d rank %d: %d steps, want %d", Q, r, len(scheds[r]), Q-1)
			}
		}
		// cnt[w][b][c]: how often worker c's contribution is in worker w's
		// copy of block b.
		cnt := make([][][]int, Q)
		sent := make([][]int, Q)
		for w := range Q {
			cnt[w] = make([][]int, Q)
			for b := range Q {
				cnt[w][b] = make([]int, Q)
				cnt[w][b][w] = 1
			}
			sent[w] = make([]int, Q)
		}
		for i := 0; i < Q-1; i++ {
			moved := make([][]int, Q)
			for w := range Q {
				st := scheds[w][i]
				if st.send == w {
					t.Fatalf("Q=%d step %d: worker %d sends its own block", Q, i, w)
				}
				if sent[w][st.send] > 0 {
					t.Fatalf("Q=%d step %d: worker %d sends block %d twice", Q, i, w, st.send)
				}
				sent[w][st.send]++
				peer := scheds[st.dst][i]
				if peer.src != w || peer.recv != st.send {
					t.Fatalf("Q=%d step %d: worker %d sends block %d to %d, which expects block %d from %d", Q, i, w, st.send, st.dst, peer.recv, peer.src)
				}
				moved[w] = cnt[w][st.send]
				cnt[w][st.send] = make([]int, Q)
			}
			for w := range Q {
				st := scheds[w][i]
				if sent[w][st.recv] > 0 {
					t.Fatalf("Q=%d step %d: worker %d receives block %d after sending it", Q, i, w, st.recv)
				}
				for c, v := range moved[st.src] {
					cnt[w][st.recv][c] += v
				}
			}
		}
		for w := range Q {
			for c := range Q {
				if cnt[w][w][c] != 1 {
					t.Fatalf("Q=%d: worker %d's block holds worker %d's contribution %d times", Q, w, c, cnt[w][w][c])
				}
			}
			for b := range Q {
				if b != w && sent[w][b] != 1 {
					t.Fatalf("Q=%d: worker %d sent block %d %d times", Q, w, b, sent[w][b])
				}
			}
		}
	}
}

// TestSparDLBruckSchedule simulates the Bruck all-gather for 1…33 members.
func TestSparDLBruckSchedule(t *testing.T) {
	for q := 1; q <= 33; q++ {
		have := make([][]int, q) // have[w][b]: item in buffer b, -1 if none
		scheds := make([][]spardlBruckStep, q)
		for w := range q {
			have[w] = make([]int, q)
			for b := range have[w] {
				have[w][b] = -1
			}
			have[w][0] = w
			scheds[w] = spardlBruck(q, w)
		}
		for i := range scheds[0] {
			next := make([][]int, q)
			for w := range q {
				next[w] = slices.Clone(have[w])
			}
			for w := range q {
				st := scheds[w][i]
				peer := scheds[st.dst][i]
				if peer.src != w {
					t.Fatalf("q=%d transfer %d: %d sends to %d, which receives from %d", q, i, w, st.dst, peer.src)
				}
				if have[w][st.sendBuf] < 0 {
					t.Fatalf("q=%d transfer %d: %d sends empty buffer %d", q, i, w, st.sendBuf)
				}
				next[st.dst][peer.recvBuf] = have[w][st.sendBuf]
			}
			have = next
		}
		for w := range q {
			for b := range q {
				if have[w][b] != (w+b)%q {
					t.Fatalf("q=%d: member %d buffer %d holds %d, want %d", q, w, b, have[w][b], (w+b)%q)
				}
			}
		}
	}
}

func TestSparDLErrors(t *testing.T) {
	l, err := FlatLayout(100)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		P     int
		teams int
		sag   string
	}{
		{"teams do not divide", 4, 3, "bruck"},
		{"negative teams", 4, -2, "bruck"},
		{"zero teams", 4, 0, "bruck"},
		{"rsag with 3 teams", 6, 3, "rsag"},
		{"unknown sag", 4, 2, "ring"},
	} {
		w := local.New(tc.P)
		_, err := New("spardl", Options{Density: 0.1, Layout: l, Comm: w.Comm(0), Params: Values{"teams": tc.teams, "sag": tc.sag}})
		if err == nil {
			t.Errorf("%s: no error", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
	w := local.New(1)
	if _, err := New("spardl", Options{Density: 0.1, Comm: w.Comm(0)}); err == nil {
		t.Error("empty layout accepted")
	}
	if _, err := New("spardl", Options{Density: 1.5, Layout: l, Comm: w.Comm(0)}); err == nil {
		t.Error("density 1.5 accepted")
	}
	r, err := New("spardl", Options{Density: 0.1, Layout: l, Comm: w.Comm(0)})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := r.Reduce(ctx, make([]float32, 99), make([]float32, 100), make([]float32, 100)); err == nil {
		t.Error("short acc accepted")
	}
	a := make([]float32, 100)
	if _, err := r.Reduce(ctx, a, a, make([]float32, 100)); err == nil {
		t.Error("out aliasing acc accepted")
	}
}

// corruptingComm changes the last index of the first index list its rank
// receives in a Spar-Reduce-Scatter step to bad, while armed.
type corruptingComm struct {
	comm.Communicator
	armed bool
	bad   int32
}

func (c *corruptingComm) SendRecv(ctx context.Context, send comm.Buffer, dst int, recv comm.Buffer, src, tag int) (int, error) {
	n, err := c.Communicator.SendRecv(ctx, send, dst, recv, src, tag)
	if err == nil && c.armed && tag == spardlTagSRS+1 && n > 0 {
		c.armed = false
		switch b := recv.(type) {
		case comm.Int32s:
			b[n-1] = c.bad
		case comm.Device:
			b.Buf.Int32s()[n-1] = c.bad
		}
	}
	return n, err
}

// TestSparDLCorruptIndex: a block index outside the block that a rank
// receives fails that rank's call (read with the call's last wait,
// Env.checkRange) naming the step, the sender, the index and its place in
// the list; the other ranks' calls complete, and every rank's next call
// works (the flag was set again).
func TestSparDLCorruptIndex(t *testing.T) {
	const n, N = 3, 100
	l, err := FlatLayout(N)
	if err != nil {
		t.Fatal(err)
	}
	C := (N + n - 1) / n
	for _, bad := range []int32{int32(C) + 5, -2} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			errs := make([][2]error, n)
			err := local.Run(context.Background(), n, func(ctx context.Context, c comm.Communicator) error {
				r := c.Rank()
				if r == 1 {
					c = &corruptingComm{Communicator: c, armed: true, bad: bad}
				}
				red, err := New("spardl", Options{Density: 0.3, Layout: l, Comm: c})
				if err != nil {
					return err
				}
				rng := rand.New(rand.NewPCG(uint64(r), 5))
				for call := range 2 {
					acc := make([]float32, N)
					for i := range acc {
						acc[i] = float32(rng.NormFloat64())
					}
					_, errs[r][call] = red.Reduce(ctx, acc, make([]float32, N), make([]float32, N))
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			want := fmt.Sprintf("reduce-scatter step 0: rank %d sent a block index outside [0, %d)", spardlSchedule(n, 1)[0].src, C)
			if e := errs[1][0]; e == nil || !strings.Contains(e.Error(), want) || !strings.Contains(e.Error(), fmt.Sprintf("index %d (element ", bad)) {
				t.Fatalf("rank 1's call with a corrupt index: %v; want it to say %q and name index %d", e, want, bad)
			}
			for r := range n {
				for call := range 2 {
					if (r != 1 || call == 1) && errs[r][call] != nil {
						t.Errorf("rank %d call %d: %v", r, call, errs[r][call])
					}
				}
			}
		})
	}
}
