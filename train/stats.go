package train

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/sparsegrad/sparsegrad/comm"
	"github.com/sparsegrad/sparsegrad/metrics"
)

// stepStats is what one rank measured in one step, and, after gatherStats,
// what the step's record says: every field listed in stepFields travels to
// every rank and is combined as its entry says.
type stepStats struct {
	// Loss is the mean training loss of the rank's batch.
	Loss float64
	// Forward, Backward, Select, Comm and Update are the phases' times;
	// Iter is the whole iteration; Compute the forward and backward pass as
	// the trainer saw it (with the pipeline's hand-over); Wait the time from
	// the end of the backward pass to the reduced gradient; CommWall the
	// wall time from the first group (or the whole gradient) entering the
	// reducer to the reduced gradient.
	Forward, Backward, Select, Comm, Update, Iter, Wait, Compute, CommWall time.Duration
	// Queued is the time a simulated worker's step waited for a shared
	// executor and for the other workers' turns before the reduction (not
	// part of Compute or Wait).
	Queued time.Duration
	// Sent and Recv are the bytes the rank's reducer sent and received.
	Sent, Recv float64
	// ErrorNorm is ‖residual‖₂ after the step.
	ErrorNorm float64
	// ActualDensity and Threshold are the reducer's (the same on every
	// rank; NaN Threshold for methods without one).
	ActualDensity, Threshold float64
	// Samples is the number of training samples of the step.
	Samples int
	// LayerK is the elements selected per tensor (methods that allocate per
	// tensor); it is not gathered: the record holds rank 0's.
	LayerK []int
}

// combine says how the ranks' values of a statistic make the step's.
type combine int

const (
	meanOf     combine = iota // the mean over ranks (summed in rank order)
	criticalOf                // the critical rank's (criticalRank): its times add up to its iteration
	sumOf                     // the sum over ranks
	rank0Of                   // rank 0's (the same on every rank)
)

// stepField is one gathered statistic of stepStats: its float64 form on the
// wire (exact for durations in nanoseconds below 104 days and for byte and
// sample counts below 2^53) and how the ranks' values combine.
type stepField struct {
	name string
	how  combine
	get  func(*stepStats) float64
	set  func(*stepStats, float64)
}

func durationField(name string, p func(*stepStats) *time.Duration) stepField {
	return stepField{name, criticalOf,
		func(s *stepStats) float64 { return float64(*p(s)) },
		func(s *stepStats, v float64) { *p(s) = time.Duration(v) }}
}

func floatField(name string, how combine, p func(*stepStats) *float64) stepField {
	return stepField{name, how,
		func(s *stepStats) float64 { return *p(s) },
		func(s *stepStats, v float64) { *p(s) = v }}
}

// stepFields are the gathered statistics, in wire order.
var stepFields = []stepField{
	floatField("loss", meanOf, func(s *stepStats) *float64 { return &s.Loss }),
	durationField("forward", func(s *stepStats) *time.Duration { return &s.Forward }),
	durationField("backward", func(s *stepStats) *time.Duration { return &s.Backward }),
	durationField("select", func(s *stepStats) *time.Duration { return &s.Select }),
	durationField("comm", func(s *stepStats) *time.Duration { return &s.Comm }),
	durationField("update", func(s *stepStats) *time.Duration { return &s.Update }),
	durationField("iter", func(s *stepStats) *time.Duration { return &s.Iter }),
	durationField("wait", func(s *stepStats) *time.Duration { return &s.Wait }),
	durationField("compute", func(s *stepStats) *time.Duration { return &s.Compute }),
	durationField("comm_wall", func(s *stepStats) *time.Duration { return &s.CommWall }),
	durationField("queued", func(s *stepStats) *time.Duration { return &s.Queued }),
	floatField("sent", meanOf, func(s *stepStats) *float64 { return &s.Sent }),
	floatField("recv", meanOf, func(s *stepStats) *float64 { return &s.Recv }),
	floatField("error_norm", meanOf, func(s *stepStats) *float64 { return &s.ErrorNorm }),
	floatField("actual_density", rank0Of, func(s *stepStats) *float64 { return &s.ActualDensity }),
	floatField("threshold", rank0Of, func(s *stepStats) *float64 { return &s.Threshold }),
	{"samples", sumOf, func(s *stepStats) float64 { return float64(s.Samples) }, func(s *stepStats, v float64) { s.Samples = int(v) }},
}

// criticalRank returns the rank the others waited for: the one that spent
// the longest before it could communicate — waiting for a shared executor
// and the other simulated workers' turns, computing and selecting (the
// largest Queued + Compute + Select; ties to the lower rank). A step record
// holds that one rank's times, which add up to its iteration; the largest
// time of every phase taken from different ranks would not (a rank that
// computed first spends its wait inside the collectives, the one that came
// last spent it queueing) and would count a wait twice. vals are the
// gathered fields, nf per rank in stepFields order.
func criticalRank(vals func(r, i int) float64, n int) int {
	best, bestV := 0, math.Inf(-1)
	for r := range n {
		v := 0.0
		for i, f := range stepFields {
			if f.name == "queued" || f.name == "compute" || f.name == "select" {
				v += vals(r, i)
			}
		}
		if v > bestV {
			best, bestV = r, v
		}
	}
	return best
}

// gatherStats combines every rank's statistics as stepFields say (the same
// result on every rank); LayerK is the local one.
func gatherStats(ctx context.Context, c comm.Communicator, s stepStats) (stepStats, error) {
	nf := len(stepFields)
	send := make(comm.Int64s, nf)
	for i, f := range stepFields {
		send[i] = int64(math.Float64bits(f.get(&s)))
	}
	n := c.Size()
	recv := make(comm.Int64s, nf*n)
	if err := c.AllGather(ctx, send, recv); err != nil {
		return stepStats{}, fmt.Errorf("train: combining step statistics: %w", err)
	}
	val := func(r, i int) float64 { return math.Float64frombits(uint64(recv[r*nf+i])) }
	crit := criticalRank(val, n)
	out := stepStats{LayerK: s.LayerK}
	for i, f := range stepFields {
		var acc float64
		switch f.how {
		case rank0Of:
			acc = val(0, i)
		case criticalOf:
			acc = val(crit, i)
		default:
			for r := range n {
				acc += val(r, i)
			}
			if f.how == meanOf {
				acc /= float64(n)
			}
		}
		f.set(&out, acc)
	}
	return out, nil
}

// opDeltas turns a communicator counter's running totals into per-step
// counts.
type opDeltas struct {
	cnt  *comm.Counter
	prev []comm.OpStats
}

func newOpDeltas(cnt *comm.Counter) *opDeltas {
	return &opDeltas{cnt: cnt, prev: make([]comm.OpStats, len(comm.Ops()))}
}

// next returns the operations called since the last call.
func (d *opDeltas) next() map[string]metrics.OpCount {
	ops := map[string]metrics.OpCount{}
	for i, op := range comm.Ops() {
		st := d.cnt.Stats(op)
		p := d.prev[i]
		if st.Calls != p.Calls {
			ops[op.String()] = metrics.OpCount{Calls: st.Calls - p.Calls, Elements: st.Elements - p.Elements,
				BytesSent: st.BytesSent - p.BytesSent, BytesRecv: st.BytesRecv - p.BytesRecv, Time: metrics.Num((st.Time - p.Time).Seconds())}
		}
		d.prev[i] = st
	}
	return ops
}

// stepRecord is the metrics record of a step from the combined statistics.
func stepRecord(s stepStats, epoch, step, workers int, lr, density float64, wall time.Duration) metrics.Step {
	rec := metrics.Step{Type: "step", Epoch: epoch + 1, Step: step, Loss: metrics.Num(s.Loss), LR: metrics.Num(lr),
		Density: metrics.Num(density), ActualDensity: metrics.Num(s.ActualDensity), ErrorNorm: metrics.Num(s.ErrorNorm),
		BytesSent: metrics.Num(s.Sent), BytesRecv: metrics.Num(s.Recv),
		TForward: metrics.Num(s.Forward.Seconds()), TBackward: metrics.Num(s.Backward.Seconds()), TSelect: metrics.Num(s.Select.Seconds()),
		TComm: metrics.Num(s.Comm.Seconds()), TUpdate: metrics.Num(s.Update.Seconds()), TIter: metrics.Num(s.Iter.Seconds()),
		TCompute: metrics.Num(s.Compute.Seconds()), TCommWall: metrics.Num(s.CommWall.Seconds()), TWait: metrics.Num(s.Wait.Seconds()), TQueue: metrics.Num(s.Queued.Seconds()),
		Samples: s.Samples, Workers: workers, Wall: metrics.Num(wall.Seconds()), LayerK: s.LayerK}
	if !math.IsNaN(s.Threshold) {
		t := metrics.Num(s.Threshold)
		rec.Threshold = &t
	}
	return rec
}
