package advise

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/sparsegrad/sparsegrad/comm/netmodel"
)

// FormatSeconds formats a duration in seconds for a table: µs, ms or s
// with three significant digits.
func FormatSeconds(s float64) string {
	switch {
	case math.IsNaN(s) || math.IsInf(s, 0):
		return "—"
	case s == 0:
		return "0"
	case s < 1e-3:
		return strconv.FormatFloat(s*1e6, 'g', 3, 64) + " µs"
	case s < 1:
		return strconv.FormatFloat(s*1e3, 'g', 3, 64) + " ms"
	}
	return strconv.FormatFloat(s, 'g', 3, 64) + " s"
}

// NetName describes a network for people: "10 Gbit/s, 50µs".
func NetName(net netmodel.Network) string {
	if net.Bandwidth == 0 {
		return "in-process (no network)"
	}
	return strconv.FormatFloat(net.Bandwidth*8/1e9, 'g', 4, 64) + " Gbit/s, " + net.Latency.String() + " latency"
}

// WriteTable writes the ranked predictions of one setting (as Rank returns
// them) as a text table, the caveats under it, the verdict (whether dense
// all-reduce wins) and the methods that cannot run there. The table ranks
// only the methods whose convergence has been shown for the host's kind of
// model (ShownFor); the others follow in a table of their own, by time
// only, flagged, and the verdict is about the ranked ones. Under the tables
// it says what is known about each method's accuracy.
func WriteTable(w io.Writer, h *Host, s Setting, ranked []Prediction, skipped map[string]error) error {
	kind := h.Kind
	if kind == "" {
		kind = KindOf(h.Model, h.Layout.Names())
	}
	fmt.Fprintf(w, "%s on %s, %d workers, %s, density %g\n", h.Model, h.Dataset, s.Workers, NetName(s.Net), s.Density)
	costs := fmt.Sprintf("measured here on %s: selection, update %s, error feedback", h.Device, FormatSeconds(h.Update))
	if h.CostSource != "" {
		costs = fmt.Sprintf("selection, update %s and error feedback for a GPU (each cost's source below)", FormatSeconds(h.Update))
	}
	switch h.StepSource {
	case "given":
		fmt.Fprintf(w, "one step %s (forward+backward, given with -step-time); %s; batch %d per worker\n",
			FormatSeconds(h.Compute), costs, h.Batch)
	case "recorded":
		fmt.Fprintf(w, "one step %s (forward+backward, measured when recording, on %s); %s; batch %d per worker\n",
			FormatSeconds(h.Compute), h.StepDevice, costs, h.Batch)
	default:
		fmt.Fprintf(w, "measured here: one step %s (forward+backward) + %s (update) on %s, batch %d per worker\n",
			FormatSeconds(h.Compute), FormatSeconds(h.Update), h.Device, h.Batch)
	}
	if kind == OtherKind {
		fmt.Fprintf(w, "kind of model: %s; nothing is ranked: no paper or run of this project shows any method's convergence on a model of unknown kind (give -kind if it is one of cnn, rnn, transformer, recommender, mlp); every method is listed by time, flagged, with what is known\n", kind)
	} else {
		fmt.Fprintf(w, "kind of model: %s; ranked: the methods whose convergence a paper or this project has shown on such models at density %g or lower (where the density is recorded; the accuracy column says); the others are listed apart, flagged\n", kind, s.Density)
	}
	if h.CostDetail != "" {
		fmt.Fprintln(w, "costs from the "+h.CostSource+": "+h.CostDetail)
	}
	fmt.Fprintln(w, "speedups are against "+DenseBaseline(h, s))
	if h.HorizonSteps > 0 {
		fmt.Fprintf(w, "actual density and bytes: each method's reducer run with error feedback over a horizon of %d steps%s on %s (mean over the horizon; at step 1; the step from which it stays within 10 %% of its last value)\n", h.HorizonAt(s.Workers), EpochNote(h, s.Workers), horizonSource(h))
		if h.Recording == "" {
			fmt.Fprintf(w, "the gradients being the same at every step, each reducer runs only until it has settled (the trend between its last two windows of steps, after any dense warm-up or epoch boundary, carried on to the horizon's end, would move the mean by at most %g %%) and the rest of the horizon repeats its last steps; \"settles\" says how many ran; a controller still moving and a dense warm-up run step by step (-steps shortens the horizon)\n", settleTol*100)
		}
		fmt.Fprintln(w)
	} else {
		fmt.Fprintln(w, "actual density and bytes: each method's steady state (no horizon simulated)")
		fmt.Fprintln(w)
	}
	var trusted, flagged []Prediction
	for _, p := range ranked {
		if p.Method == "dense" || ShownFor(p.Method, kind, s.Density) {
			trusted = append(trusted, p)
		} else {
			flagged = append(flagged, p)
		}
	}
	var notes []string
	table := func(ps []Prediction, rank bool) error {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		head := "rank\t"
		if !rank {
			head = "\t"
		}
		fmt.Fprintln(tw, head+"method\tselection\tcommunication\titeration\tvs dense\tactual density\tsent/worker\tat step 1\tsettles\taccuracy\t")
		for i, p := range ps {
			speed := strconv.FormatFloat(p.Speedup, 'f', 2, 64) + "×"
			dens := strconv.FormatFloat(p.ActualDensity, 'g', 3, 64)
			if p.Method != "dense" {
				dens += " (" + fmtRatio(p.ActualDensity/p.Density) + "× ρ)"
			}
			mark := ""
			if len(p.Caveats) > 0 {
				mark = " *"
				for _, c := range p.Caveats {
					notes = append(notes, p.Method+": "+c)
				}
			}
			start, settles := "", ""
			if p.HorizonSteps > 0 {
				start = strconv.FormatFloat(p.StartDensity, 'g', 3, 64) + ", " + fmtBytes(p.StartBytes)
				settles = "step " + strconv.Itoa(p.Settled)
				if p.Settled >= p.HorizonSteps && p.HorizonSteps > 1 {
					settles = "not in " + strconv.Itoa(p.HorizonSteps)
				}
				if p.Simulated > 0 && p.Simulated < p.HorizonSteps {
					settles += fmt.Sprintf(" (simulated %d of %d)", p.Simulated, p.HorizonSteps)
				}
			}
			r := "!"
			if rank {
				r = strconv.Itoa(i + 1)
			}
			fmt.Fprintf(tw, "%s\t%s%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", r, p.Method, mark, FormatSeconds(p.Select), FormatSeconds(p.Comm),
				FormatSeconds(p.Iter), speed, dens, fmtBytes(p.BytesSent), start, settles, AccuracyCell(p.Method, kind, p.Density))
		}
		return tw.Flush()
	}
	if err := table(trusted, true); err != nil {
		return err
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, Verdict(trusted))
	if len(flagged) > 0 {
		fmt.Fprintf(w, "\n! not ranked: convergence not shown for %s models (by time only; they may train to a worse model):\n", kind)
		if err := table(flagged, false); err != nil {
			return err
		}
		if len(trusted) > 0 && flagged[0].Iter < trusted[0].Iter {
			fmt.Fprintf(w, "%s would be faster (%s per iteration) but is not ranked: %s\n", flagged[0].Method, FormatSeconds(flagged[0].Iter), accuracyWhy(flagged[0].Method, kind, s.Density))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintln(w, "\n* caveats:")
		for _, n := range notes {
			fmt.Fprintln(w, "  - "+n)
		}
	}
	fmt.Fprintln(w, "\nwhat is known about accuracy:")
	for _, p := range append(trusted, flagged...) {
		if p.Method == "dense" {
			continue
		}
		fmt.Fprintf(w, "  - %s: %s\n", p.Method, accuracyWhy(p.Method, kind, s.Density))
	}
	if len(skipped) > 0 {
		names := make([]string, 0, len(skipped))
		for m := range skipped {
			names = append(names, m)
		}
		sort.Strings(names)
		fmt.Fprintln(w, "\nnot ranked:")
		for _, m := range names {
			fmt.Fprintf(w, "  - %s: %v\n", m, skipped[m])
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}

// DenseBaseline names the dense all-reduce the speedups of s are computed
// against.
func DenseBaseline(h *Host, s Setting) string {
	if s.NoOverlap {
		return "dense all-reduce after the backward pass (not overlapped: -overlap off)"
	}
	capMB := s.BucketMB
	if capMB <= 0 {
		capMB = BucketMB
	}
	how := "the backward time spread over the tensors in proportion to their sizes (per-layer times not profiled)"
	if _, profiled := h.readyTimes(); profiled {
		how = "the profiled gradient-ready times of the backward pass"
	}
	return fmt.Sprintf("overlapped dense as PyTorch DDP runs it: buckets closed at %g MiB (the first at %g MiB) in the order the backward pass finishes the gradients, each all-reduced (α-β) as soon as it is final, from %s; only the tail after the backward pass adds to the iteration (-overlap off: dense after the backward pass)",
		capMB, min(FirstBucketMB, capMB), how)
}

// EpochNote says how the horizon compares with one epoch of the model at
// P workers, for a table's header ("" when the epoch is not known).
func EpochNote(h *Host, P int) string {
	if h.EpochSteps <= 0 || P < 1 {
		return ""
	}
	e := (h.EpochSteps + P - 1) / P
	if h.HorizonAt(P) >= e {
		return fmt.Sprintf(" (at least one epoch at %d workers, %d steps)", P, e)
	}
	return fmt.Sprintf(" (SHORTER than one epoch at %d workers, %d steps: a controller that moves slowly is shown near its start, see \"settles\"; pass -steps %d for the epoch)", P, e, e)
}

// horizonSource says which gradients the horizon ran on.
func horizonSource(h *Host) string {
	if h.Recording != "" {
		return "the recording's steps in turn"
	}
	return fmt.Sprintf("the gradients of %d workers measured at step %d, repeated", h.GradWorkers, h.GradStep)
}

// accuracyWhy is one line of what is known about method's accuracy.
func accuracyWhy(method string, k Kind, density float64) string {
	kn := Known(method)
	s := kn.Papers
	if kn.Project != "" {
		s += "; this project: " + kn.Project
	} else {
		s += "; not run to convergence by this project"
	}
	if kn.Warning != "" {
		s += "; " + kn.Warning
	}
	switch at, ok := shownAt(kn, k); {
	case len(kn.Shown) > 0 && !slices.Contains(kn.Shown, k):
		s += " — nothing on " + string(k) + " models"
	case ok && !ShownFor(method, k, density):
		s += fmt.Sprintf(" — on %s models shown only at ρ = %g (%d workers), not at ρ = %g", k, at.Density, at.Workers, density)
	}
	return s
}

// Verdict says in one sentence which method wins and whether sparsifying
// pays off at all.
func Verdict(ranked []Prediction) string {
	if len(ranked) == 0 {
		return "No method could be ranked."
	}
	best := ranked[0]
	if best.Method == "dense" {
		if len(ranked) == 1 {
			return "Dense all-reduce is the only method ranked."
		}
		second := ranked[1]
		if r := second.Iter / best.Iter; r < 1.05 {
			return fmt.Sprintf("Dense all-reduce wins, narrowly: the best sparsifier, %s, is predicted at %s per iteration against dense's %s (%.3f× as long), less than these measurements can tell apart; sparsifying does not pay off on this network.",
				second.Method, FormatSeconds(second.Iter), FormatSeconds(best.Iter), r)
		}
		return fmt.Sprintf("Dense all-reduce wins: no sparsifier is predicted to be faster per iteration here (the best, %s, takes %.2f× as long), so sparsifying does not pay off on this network.",
			second.Method, second.Iter/best.Iter)
	}
	dense := best.Iter * best.Speedup
	if best.Speedup < 1.05 {
		return fmt.Sprintf("Sparsifying barely pays off here: the fastest, %s, is only %.2f× dense all-reduce's speed (%s vs %s per iteration), less than these measurements can tell apart; the iteration is mostly computation.",
			best.Method, best.Speedup, FormatSeconds(best.Iter), FormatSeconds(dense))
	}
	return fmt.Sprintf("%s is predicted fastest: %.2f× the iterations per second of dense all-reduce (%s vs %s per iteration). Its convergence is shown on such models (below), not on yours: check on the sweep page that it converges as well as dense.",
		best.Method, best.Speedup, FormatSeconds(best.Iter), FormatSeconds(dense))
}

// fmtRatio formats a density's ratio to ρ: two significant digits below
// 0.95 (a method that sends less than ρ), one decimal up to 10, none above.
func fmtRatio(r float64) string {
	switch {
	case r >= 9.95:
		return strconv.FormatFloat(r, 'f', 0, 64)
	case r >= 0.95:
		return strconv.FormatFloat(r, 'f', 1, 64)
	}
	return strconv.FormatFloat(r, 'g', 2, 64)
}

func fmtBytes(b float64) string {
	switch {
	case b >= 1e9:
		return strconv.FormatFloat(b/1e9, 'f', 2, 64) + " GB"
	case b >= 1e6:
		return strconv.FormatFloat(b/1e6, 'f', 2, 64) + " MB"
	case b >= 1e3:
		return strconv.FormatFloat(b/1e3, 'f', 1, 64) + " kB"
	}
	return strconv.FormatFloat(b, 'f', 0, 64) + " B"
}

// ParseNetworks turns lists of bandwidths (Gbit/s) and one latency into
// networks, refusing values the model cannot use.
func ParseNetworks(gbits []float64, latency time.Duration) ([]netmodel.Network, error) {
	var out []netmodel.Network
	for _, g := range gbits {
		n := netmodel.Network{Latency: latency, Bandwidth: g * 1e9 / 8}
		if err := n.Validate(); err != nil {
			return nil, fmt.Errorf("advise: bandwidth %v Gbit/s, latency %v: %w", g, latency, err)
		}
		out = append(out, n)
	}
	return out, nil
}
