// Package metrics defines the records of a run's metrics.jsonl, one JSON
// object per line, and its run.json (Run): the schemas package train writes
// and package reports reads, declared once here so that the two cannot
// drift apart. It has no dependencies beyond the standard library.
//
// A line's "type" tells the record apart: "step" (Step) or "eval" (Eval).
// Readers skip lines of other types. Numbers that are NaN or infinite are
// written as null (JSON has no such numbers) and read back as NaN.
package metrics

import (
	"bytes"
	"math"
	"strconv"
	"strings"
)

// Thousands formats n with commas between groups of three digits
// ("217,630"), as the terminal and the reports show an evaluation's sample
// and split sizes.
func Thousands(n int) string { return GroupDigits(strconv.Itoa(n)) }

// GroupDigits puts commas between the groups of three digits of the whole
// part of s, a decimal number as strconv writes it without an exponent:
// "-1234567.125" is "-1,234,567.125".
func GroupDigits(s string) string {
	var b strings.Builder
	if rest, neg := strings.CutPrefix(s, "-"); neg {
		b.WriteByte('-')
		s = rest
	}
	whole, frac, dot := strings.Cut(s, ".")
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if dot {
		b.WriteString("." + frac)
	}
	return b.String()
}

// The values of a record's "type".
const (
	TypeStep = "step"
	TypeEval = "eval"
)

// Num is a float64 that encodes as JSON null when it is NaN or infinite and
// decodes null as NaN.
type Num float64

// MarshalJSON implements json.Marshaler.
func (x Num) MarshalJSON() ([]byte, error) {
	f := float64(x)
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return []byte("null"), nil
	}
	return strconv.AppendFloat(nil, f, 'g', -1, 64), nil
}

// UnmarshalJSON implements json.Unmarshaler: a JSON number, or null for NaN.
func (x *Num) UnmarshalJSON(b []byte) error {
	if bytes.Equal(b, []byte("null")) {
		*x = Num(math.NaN())
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return &numError{string(b)}
	}
	*x = Num(f)
	return nil
}

// numError is the error of a value that is neither a number nor null.
type numError struct{ s string }

func (e *numError) Error() string {
	return "metrics: " + strconv.Quote(e.s) + " is not a number or null"
}

// Step is one line with "type":"step". Epoch is 1-based (the epoch the step
// belongs to); Step counts iterations from 1. Bytes are per worker, averaged
// over workers. Times are in seconds, all of one worker: the one the others
// waited for, which spent the longest queueing, computing and selecting
// (the largest TQueue + TCompute + TSelect), so that they add up to its
// iteration:
//
//	TIter = TQueue + TCompute + TWait + TUpdate
//
// TCompute is the model's whole forward and backward step (the pipeline's
// hand-over included), TForward the part from the start of the step to the
// first gradient that is final (so it includes the backward of the output
// layer), TBackward the rest as the model measured it (TForward and
// TBackward are null when the split is not measured). TWait is the time from
// the end of the backward pass until the averaged gradient was complete:
// gradient clipping, error feedback and the reducer's call, of which TSelect
// and TComm are the reducer's selection and communication times (TComm is
// the sum of the communicator calls' durations, which calls in flight
// together can make exceed the wall time they took; under LAGS pipelining
// the groups' requests overlap the backward pass and each other, and the
// groups' TSelect and TComm are not within TWait). TCommWall is the wall
// time from the start of the reduction (under pipelining: of the first
// group, during the backward pass) until the averaged gradient was
// complete, so that TCommWall − TWait is the part of the backward pass the
// reduction ran alongside. TUpdate is the optimizer's step.
type Step struct {
	Type  string `json:"type"`
	Epoch int    `json:"epoch"`
	Step  int    `json:"step"`
	Loss  Num    `json:"loss"`
	LR    Num    `json:"lr"`
	// Density is the setup density ρ (-density) for every method,
	// ActualDensity the union of the indices whose values crossed the wire
	// over N, ErrorNorm the norm of what the worker holds back (one
	// meaning each across methods: sparsify.Stats says what each method
	// counts).
	Density       Num `json:"density"`
	ActualDensity Num `json:"actual_density"`
	ErrorNorm     Num `json:"error_norm"`
	// Threshold is the method's magnitude threshold, absent for methods
	// without one.
	Threshold *Num `json:"threshold,omitempty"`
	BytesSent Num  `json:"bytes_sent"`
	BytesRecv Num  `json:"bytes_recv"`
	TForward  Num  `json:"t_forward"`
	TBackward Num  `json:"t_backward"`
	TSelect   Num  `json:"t_select"`
	TComm     Num  `json:"t_comm"`
	TUpdate   Num  `json:"t_update"`
	TIter     Num  `json:"t_iter"`
	TWait     Num  `json:"t_wait"`
	TCompute  Num  `json:"t_compute"`
	TCommWall Num  `json:"t_comm_wall"`
	// TQueue is, for simulated workers taking turns on shared executors,
	// the time the worker's step waited for an executor and for the other
	// workers' turns before the reduction (which simulated workers enter
	// together, as a cluster's do, unless LAGS pipelining starts it during
	// the backward pass); 0 when every worker has its own model. TCompute,
	// TWait and the reducer's times do not include it.
	TQueue Num `json:"t_queue"`
	// LayerK is rank 0's number of selected elements per tensor, for
	// methods that allocate the budget per tensor (absent otherwise).
	LayerK []int `json:"layer_k,omitempty"`
	// Ops are rank 0's communicator counters of the reducer's calls since
	// the previous step record, per operation (comm.Op names: "allreduce",
	// "allgather", "allgatherv", "broadcast", "reducescatter", "send",
	// "recv", "sendrecv", "barrier").
	Ops     map[string]OpCount `json:"ops,omitempty"`
	Samples int                `json:"samples"`
	Workers int                `json:"workers"`
	// Wall is the time since the start of the run, in seconds.
	Wall Num `json:"wall"`
}

// OpCount is the traffic of one communicator operation in a step record.
type OpCount struct {
	Calls     int64 `json:"calls"`
	Elements  int64 `json:"elements"`
	BytesSent int64 `json:"bytes_sent"`
	BytesRecv int64 `json:"bytes_recv"`
	// Time is the calls' duration in seconds.
	Time Num `json:"time"`
}

// Eval is one line with "type":"eval": Metric is "accuracy" (fraction),
// "perplexity", "hr10" or "ndcg10" (fractions), or "loss" (the mean
// evaluation loss).
type Eval struct {
	Type   string `json:"type"`
	Epoch  int    `json:"epoch"`
	Step   int    `json:"step"`
	Wall   Num    `json:"wall"`
	Metric string `json:"metric"`
	Value  Num    `json:"value"`
	// Split is the data split evaluated: "test" or "validation" (absent in
	// records written before it was recorded).
	Split string `json:"split,omitempty"`
	// Evaluated is what the evaluation covered and SplitSize what the whole
	// split holds, both over all workers, in Unit ("images", "tokens",
	// "users"); Evaluated < SplitSize is an evaluation on a sample of the
	// split (-max-eval-batches, or a run shorter than an epoch). Absent
	// (0) when not recorded.
	Evaluated int    `json:"evaluated,omitempty"`
	SplitSize int    `json:"split_size,omitempty"`
	Unit      string `json:"unit,omitempty"`
}
